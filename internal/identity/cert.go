package identity

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// CertSource is what the data path needs from the identity system: the
// current certificate of a local workload identity, with the trust bundle
// that peers of that identity are verified against. Implementations must be
// safe for concurrent use and cheap on the hot path (cached).
type CertSource interface {
	// Fetch returns the certificate for id. It may block until the first
	// certificate is available or ctx is done.
	Fetch(ctx context.Context, id Identity) (*WorkloadCertificate, error)
}

// WorkloadCertificate is a workload's certificate chain, private key and
// trust bundle. It is immutable once built: rotation builds a new one.
type WorkloadCertificate struct {
	Identity Identity
	// TLS holds the leaf (first) and any intermediates, with the private key,
	// ready for tls.Config.Certificates.
	TLS tls.Certificate
	// Leaf is the parsed leaf certificate.
	Leaf *x509.Certificate
	// Roots is the trust bundle (every root the CA returned).
	Roots *x509.CertPool
	// RootCerts are the trust bundle's certificates, for config dumps.
	RootCerts []*x509.Certificate
}

// NotBefore and NotAfter report the leaf's validity window.
func (c *WorkloadCertificate) NotBefore() time.Time { return c.Leaf.NotBefore }

// NotAfter reports when the leaf expires.
func (c *WorkloadCertificate) NotAfter() time.Time { return c.Leaf.NotAfter }

// RefreshAt is the leaf's half-life, when it should be renewed (as Istio's ztunnel does).
func (c *WorkloadCertificate) RefreshAt() time.Time {
	nb, na := c.Leaf.NotBefore, c.Leaf.NotAfter
	return nb.Add(na.Sub(nb) / 2)
}

// GenerateKey returns a new ECDSA P-256 private key, the only key type
// workload certificates use.
func GenerateKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// NewCSR builds a PEM CSR for id signed by key: empty subject, a single URI
// SAN, ECDSA with SHA-256, as Istio's ztunnel sends.
func NewCSR(id Identity, key crypto.Signer) ([]byte, error) {
	u, err := url.Parse(id.String())
	if err != nil || id.IsZero() {
		return nil, fmt.Errorf("identity: csr for %q: invalid identity", id)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		URIs:               []*url.URL{u},
		SignatureAlgorithm: x509.ECDSAWithSHA256,
	}, key)
	if err != nil {
		return nil, fmt.Errorf("identity: csr for %s: %w", id, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// FromChain builds a WorkloadCertificate from a CA response: PEM blocks with
// the leaf first and the roots last (the last element may hold several
// concatenated roots, all of which become trust anchors). It checks that the
// leaf matches key, carries exactly the identity want, and chains to the
// returned roots.
func FromChain(want Identity, key crypto.Signer, chainPEM []string) (*WorkloadCertificate, error) {
	if len(chainPEM) < 2 {
		return nil, fmt.Errorf("identity: chain for %s: want leaf and root, got %d elements", want, len(chainPEM))
	}
	var chain []*x509.Certificate
	for i, p := range chainPEM[:len(chainPEM)-1] {
		certs, err := ParseCertificatesPEM([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("identity: chain for %s: element %d: %w", want, i, err)
		}
		chain = append(chain, certs...)
	}
	roots, err := ParseCertificatesPEM([]byte(chainPEM[len(chainPEM)-1]))
	if err != nil {
		return nil, fmt.Errorf("identity: chain for %s: roots: %w", want, err)
	}
	if len(chain) == 0 || len(roots) == 0 {
		return nil, fmt.Errorf("identity: chain for %s: empty leaf or root element", want)
	}
	return Assemble(want, key, chain, roots)
}

// Assemble checks and packages a parsed chain (leaf first, intermediates
// after) with its private key and roots.
func Assemble(want Identity, key crypto.Signer, chain, roots []*x509.Certificate) (*WorkloadCertificate, error) {
	leaf := chain[0]
	got, err := FromCertificate(leaf)
	if err != nil {
		return nil, fmt.Errorf("identity: leaf for %s: %w", want, err)
	}
	if got != want {
		return nil, fmt.Errorf("identity: leaf carries %s, want %s", got, want)
	}
	if !publicKeysEqual(leaf.PublicKey, key.Public()) {
		return nil, fmt.Errorf("identity: leaf for %s does not match the private key", want)
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	// Check the chain now, as a peer's handshake will. istiod backdates a
	// leaf's start by two minutes but not its root's, so checking at the
	// leaf's start refused every leaf of a fresh or rotated root for two
	// minutes. The time is clamped into the leaf's own window because a
	// leaf minted expired or not yet valid still proves whom it chains to;
	// the handshake refuses it for its time.
	at := time.Now()
	if at.Before(leaf.NotBefore) {
		at = leaf.NotBefore
	}
	if at.After(leaf.NotAfter) {
		at = leaf.NotAfter
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: inter, CurrentTime: at,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return nil, fmt.Errorf("identity: leaf for %s does not chain to the returned roots: %w", want, err)
	}
	tc := tls.Certificate{PrivateKey: key, Leaf: leaf}
	for _, c := range chain {
		tc.Certificate = append(tc.Certificate, c.Raw)
	}
	return &WorkloadCertificate{Identity: want, TLS: tc, Leaf: leaf, Roots: pool, RootCerts: roots}, nil
}

// ParseCertificatesPEM parses every CERTIFICATE block in data, rejecting
// input with none and any non-certificate block.
func ParseCertificatesPEM(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("unexpected PEM block %q", b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate %d: %w", len(out), err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return out, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}
