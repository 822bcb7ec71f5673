// Package reloadtls is gRPC client TLS credentials whose roots are read at
// every handshake, so a client that reconnects after its root file was
// reloaded (certmanager.RootFile) verifies the server against the new roots.
// The xDS client and the CA requester both use it. It holds no state of its
// own beyond the roots function it is given and never serves.
package reloadtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
)

// Credentials returns client credentials that verify the server against
// roots() at each handshake. serverName overrides the name checked (""
// means the dialled host).
func Credentials(roots func() *x509.CertPool, serverName string) credentials.TransportCredentials {
	return &creds{roots: roots, serverName: serverName}
}

type creds struct {
	roots      func() *x509.CertPool
	serverName string
}

func (c *creds) current() credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{RootCAs: c.roots(), ServerName: c.serverName, MinVersion: tls.VersionTLS12})
}

// ClientHandshake implements credentials.TransportCredentials.
func (c *creds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.current().ClientHandshake(ctx, authority, conn)
}

// ServerHandshake implements credentials.TransportCredentials; these
// credentials are client-side only.
func (c *creds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("reloadtls: client credentials cannot serve")
}

// Info implements credentials.TransportCredentials.
func (c *creds) Info() credentials.ProtocolInfo { return c.current().Info() }

// Clone implements credentials.TransportCredentials.
func (c *creds) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

// OverrideServerName implements credentials.TransportCredentials.
func (c *creds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
