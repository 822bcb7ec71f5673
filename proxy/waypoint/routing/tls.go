package routing

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TLS origination (DestinationRule tls SIMPLE or MUTUAL): the client
// configuration a backend's endpoints are reached with, compiled once per
// config push.

// compileTLS builds the client configuration of ct for backend hostname,
// or an error saying why it cannot (the request then fails closed, never
// in plaintext).
func compileTLS(ct *waypointapi.ClientTLS, hostname string) (*tls.Config, error) {
	if ct == nil {
		return nil, nil
	}
	cfg := &tls.Config{ServerName: ct.GetSni(), NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}
	if cfg.ServerName == "" {
		cfg.ServerName = hostname
	}
	if ct.GetMutual() {
		cert, err := tls.X509KeyPair(ct.GetCertChain(), ct.GetPrivateKey())
		if err != nil {
			return nil, fmt.Errorf("client certificate of %s: %w", ct.GetCredential(), err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if ct.GetInsecureSkipVerify() {
		cfg.InsecureSkipVerify = true
		return cfg, nil
	}
	var roots *x509.CertPool // nil: the system's
	if ca := ct.GetCaCertificates(); len(ca) > 0 {
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("CA certificates of %s: no PEM certificate", ct.GetCredential())
		}
		cfg.RootCAs = roots
	}
	sans := ct.GetSubjectAltNames()
	if len(sans) == 0 {
		return cfg, nil // the chain and the SNI (ServerName), as Go verifies
	}
	// subjectAltNames replace the ServerName check: the chain is verified
	// here, then one of the SANs must be the certificate's.
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the server sent no certificate")
		}
		leaf := cs.PeerCertificates[0]
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
			return err
		}
		for _, san := range sans {
			if leaf.VerifyHostname(san) == nil || slices.ContainsFunc(leaf.URIs, func(u *url.URL) bool { return u.String() == san }) {
				return nil
			}
		}
		return fmt.Errorf("tls: the server certificate (DNS %v, URI %v) has none of the subjectAltNames %v", leaf.DNSNames, leaf.URIs, sans)
	}
	return cfg, nil
}
