package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
)

// reloadingTLS is TLS client credentials that build their configuration at
// every handshake from roots(), so each reconnect verifies the server
// against the roots in force then (ClientConfig.Roots).
func reloadingTLS(roots func() *x509.CertPool, serverName string) credentials.TransportCredentials {
	return &rootsTLS{roots: roots, serverName: serverName}
}

type rootsTLS struct {
	roots      func() *x509.CertPool
	serverName string
}

func (c *rootsTLS) current() credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{RootCAs: c.roots(), ServerName: c.serverName, MinVersion: tls.VersionTLS12})
}

func (c *rootsTLS) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.current().ClientHandshake(ctx, authority, conn)
}

func (c *rootsTLS) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("xds: client credentials cannot serve")
}

func (c *rootsTLS) Info() credentials.ProtocolInfo { return c.current().Info() }

func (c *rootsTLS) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

// OverrideServerName implements credentials.TransportCredentials.
func (c *rootsTLS) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
