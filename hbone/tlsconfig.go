package hbone

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// alpnH2 is the only protocol HBONE negotiates.
const alpnH2 = "h2"

// serverTLSConfig is the 15008 listener's TLS config: TLS 1.3 only, ALPN
// h2, the certificate of the local workload (fetched per handshake, so
// rotation applies to new connections), and a client certificate that must
// chain to that workload's trust bundle and carry a SPIFFE id in its trust
// domain. Authorization of the peer identity is the Handler's job.
func serverTLSConfig(local identity.Identity, certs identity.CertSource) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		NextProtos: []string{alpnH2},
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			wc, err := certs.Fetch(hello.Context(), local)
			if err != nil {
				return nil, fmt.Errorf("hbone: certificate for %s: %w", local, err)
			}
			return &tls.Config{
				MinVersion:                  tls.VersionTLS13,
				MaxVersion:                  tls.VersionTLS13,
				NextProtos:                  []string{alpnH2},
				Certificates:                []tls.Certificate{wc.TLS},
				ClientAuth:                  tls.RequireAnyClientCert,
				SessionTicketsDisabled:      true,
				DynamicRecordSizingDisabled: true,
				VerifyConnection: func(cs tls.ConnectionState) error {
					_, err := verifyClient(cs, wc, local.TrustDomain)
					return err
				},
			}, nil
		},
	}
}

// verifyClient checks a client chain against the bundle and the trust
// domain and returns the client's identity.
func verifyClient(cs tls.ConnectionState, wc *identity.WorkloadCertificate, td string) (identity.Identity, error) {
	if err := verifyChain(cs.PeerCertificates, wc.Roots, x509.ExtKeyUsageClientAuth); err != nil {
		return identity.Identity{}, err
	}
	for _, u := range cs.PeerCertificates[0].URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		if id, err := identity.Parse(u.String()); err == nil && id.TrustDomain == td {
			return id, nil
		}
	}
	return identity.Identity{}, fmt.Errorf("client certificate %s: %w: no SPIFFE id in trust domain %q",
		uriList(cs.PeerCertificates[0]), ErrIdentityMismatch, td)
}

// clientTLSConfig is the outbound TLS config for one connection: the
// source workload's certificate, no SNI, no session resumption, TLS 1.3,
// ALPN h2, and a server that chains to the source workload's trust bundle
// and names one of want in a URI SAN (not hostname verification). The
// verified server identity is stored in *got.
func clientTLSConfig(wc *identity.WorkloadCertificate, want []identity.Identity, got *identity.Identity) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		MaxVersion:   tls.VersionTLS13,
		NextProtos:   []string{alpnH2},
		Certificates: []tls.Certificate{wc.TLS},
		// No ServerName: no SNI is sent. Verification is ours, below.
		InsecureSkipVerify:          true,
		SessionTicketsDisabled:      true,
		DynamicRecordSizingDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, err := verifyServer(cs, wc, want)
			if err == nil {
				*got = id
			}
			return err
		},
	}
}

func verifyServer(cs tls.ConnectionState, wc *identity.WorkloadCertificate, want []identity.Identity) (identity.Identity, error) {
	if err := verifyChain(cs.PeerCertificates, wc.Roots, x509.ExtKeyUsageServerAuth); err != nil {
		return identity.Identity{}, err
	}
	for _, u := range cs.PeerCertificates[0].URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		id, err := identity.Parse(u.String())
		if err != nil {
			continue
		}
		for _, w := range want {
			if id == w {
				return id, nil
			}
		}
	}
	return identity.Identity{}, fmt.Errorf("server certificate %s: %w: want one of %v",
		uriList(cs.PeerCertificates[0]), ErrIdentityMismatch, want)
}

func verifyChain(chain []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage) error {
	if len(chain) == 0 {
		return errors.New("peer sent no certificate")
	}
	if roots == nil {
		return errors.New("no trust bundle for the local workload")
	}
	opts := x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}
	if len(chain) > 1 {
		opts.Intermediates = x509.NewCertPool()
		for _, c := range chain[1:] {
			opts.Intermediates.AddCert(c)
		}
	}
	if _, err := chain[0].Verify(opts); err != nil {
		return fmt.Errorf("peer certificate: %w", err)
	}
	return nil
}

func uriList(c *x509.Certificate) string {
	s := make([]string, len(c.URIs))
	for i, u := range c.URIs {
		s[i] = u.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}
