package hbone

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// alpnH2 is the only protocol HBONE negotiates.
const alpnH2 = "h2"

// serverTLSConfig is the 15008 listener's TLS config: TLS 1.3 only, ALPN
// h2, the certificate of the local workload (fetched per handshake, so
// rotation applies to new connections), and a client certificate that must
// chain to that workload's trust bundle and carry a SPIFFE id in its trust
// domain. Authorization of the peer identity is the Handler's job. rev,
// when set, refuses a client whose chain holds a revoked certificate.
func serverTLSConfig(local identity.Identity, certs identity.CertSource, cache *verifyCache, rev Revocation) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		NextProtos: []string{alpnH2},
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			wc, err := certs.Fetch(hello.Context(), local)
			if err != nil {
				return nil, fmt.Errorf("certificate for %s: %w", local, err)
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
					if _, err := verifyClient(cs, wc, local.TrustDomain, cache); err != nil {
						return err
					}
					return checkRevoked(rev, cs.PeerCertificates, true)
				},
			}, nil
		},
	}
}

// verifyClient checks a client chain against the bundle and the trust
// domain and returns the client's identity.
func verifyClient(cs tls.ConnectionState, wc *identity.WorkloadCertificate, td string, cache *verifyCache) (identity.Identity, error) {
	if err := verifyChain(cs.PeerCertificates, wc.Roots, x509.ExtKeyUsageClientAuth, cache); err != nil {
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
// verified server identity is stored in *got. rev, when set, refuses a
// server whose chain holds a revoked certificate.
func clientTLSConfig(wc *identity.WorkloadCertificate, want []identity.Identity, got *identity.Identity, cache *verifyCache, rev Revocation) *tls.Config {
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
			id, err := verifyServer(cs, wc, want, cache)
			if err == nil {
				err = checkRevoked(rev, cs.PeerCertificates, false)
			}
			if err == nil {
				*got = id
			}
			return err
		},
	}
}

func verifyServer(cs tls.ConnectionState, wc *identity.WorkloadCertificate, want []identity.Identity, cache *verifyCache) (identity.Identity, error) {
	if err := verifyChain(cs.PeerCertificates, wc.Roots, x509.ExtKeyUsageServerAuth, cache); err != nil {
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

func verifyChain(chain []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, cache *verifyCache) error {
	if len(chain) == 0 {
		return errors.New("peer sent no certificate")
	}
	if roots == nil {
		return errors.New("no trust bundle for the local workload")
	}
	key := cache.key(chain, roots, usage)
	if cache.hit(key, time.Now()) {
		return nil
	}
	opts := x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}
	if len(chain) > 1 {
		opts.Intermediates = x509.NewCertPool()
		for _, c := range chain[1:] {
			opts.Intermediates.AddCert(c)
		}
	}
	chains, err := chain[0].Verify(opts)
	if err != nil {
		return fmt.Errorf("peer certificate: %w", err)
	}
	cache.add(key, chains)
	return nil
}

// verifyCache remembers chains that verified against a trust bundle so a
// workload that reconnects costs no second chain verification: the same
// certificates (by SHA-256 of their DER) against the same *x509.CertPool
// with the same key usage verify the same way, as long as now is inside
// the validity window of every certificate of the verified chain, which is
// checked on each hit. A rotated bundle is a new pool, hence a miss. The
// handshake signature (proof of the private key) is checked by TLS on
// every handshake regardless. A nil *verifyCache caches nothing.
type verifyCache struct {
	mu sync.Mutex
	m  map[verifyKey]validity
}

type verifyKey struct {
	roots *x509.CertPool
	usage x509.ExtKeyUsage
	sum   [sha256.Size]byte
}

type validity struct{ notBefore, notAfter time.Time }

const maxVerifyCache = 4096

func newVerifyCache() *verifyCache { return &verifyCache{m: make(map[verifyKey]validity)} }

func (vc *verifyCache) key(chain []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage) verifyKey {
	if vc == nil {
		return verifyKey{}
	}
	h := sha256.New()
	for _, c := range chain {
		var l [4]byte
		binary.BigEndian.PutUint32(l[:], uint32(len(c.Raw)))
		h.Write(l[:])
		h.Write(c.Raw)
	}
	k := verifyKey{roots: roots, usage: usage}
	h.Sum(k.sum[:0])
	return k
}

func (vc *verifyCache) hit(k verifyKey, now time.Time) bool {
	if vc == nil {
		return false
	}
	vc.mu.Lock()
	v, ok := vc.m[k]
	vc.mu.Unlock()
	return ok && !now.Before(v.notBefore) && !now.After(v.notAfter)
}

func (vc *verifyCache) add(k verifyKey, chains [][]*x509.Certificate) {
	if vc == nil || len(chains) == 0 {
		return
	}
	var v validity
	for i, c := range chains[0] {
		if i == 0 || c.NotBefore.After(v.notBefore) {
			v.notBefore = c.NotBefore
		}
		if i == 0 || c.NotAfter.Before(v.notAfter) {
			v.notAfter = c.NotAfter
		}
	}
	vc.mu.Lock()
	if len(vc.m) >= maxVerifyCache {
		for old := range vc.m { // evict an arbitrary entry
			delete(vc.m, old)
			break
		}
	}
	vc.m[k] = v
	vc.mu.Unlock()
}

func uriList(c *x509.Certificate) string {
	s := make([]string, len(c.URIs))
	for i, u := range c.URIs {
		s[i] = u.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}
