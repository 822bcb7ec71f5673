// Package ca is ztunnel-go's certificate authority: it signs workload
// certificates (ECDSA P-256, exactly one SPIFFE URI SAN) from CSRs, under a
// root it creates or loads from PEM, and answers with the chain leaf first and
// the trust bundle last, as Istio's CA does.
//
// It decides nothing about who may ask for what: callers (the control plane's
// CreateCertificate service) authenticate and authorize, then call Sign with
// the identity they approved. The data path never imports this package.
package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// DefaultTTL is the workload certificate lifetime when none is asked for.
const DefaultTTL = 24 * time.Hour

// MaxTTL caps what a caller may ask for (Istio's MAX_WORKLOAD_CERT_TTL).
const MaxTTL = 90 * 24 * time.Hour

// ErrBadCSR is wrapped by every error about the CSR itself.
var ErrBadCSR = errors.New("invalid certificate signing request")

// Options configures a CA. The zero value is a CA for cluster.local with a
// new in-memory root and a 24h default TTL.
type Options struct {
	// TrustDomain of the root and of every identity it signs; "" means cluster.local.
	TrustDomain string
	// DefaultTTL when a request asks for none (<=0); 0 means DefaultTTL.
	DefaultTTL time.Duration
	// RootCertPEM and RootKeyPEM load an existing root; both nil means "generate one".
	RootCertPEM, RootKeyPEM []byte
	// Now returns the current time; nil means time.Now. Tests use it to mint
	// expired or not-yet-valid certificates.
	Now func() time.Time
}

// CA signs workload certificates. It is safe for concurrent use.
type CA struct {
	td         string
	defaultTTL time.Duration
	root       *x509.Certificate
	rootKey    crypto.Signer
	rootPEM    []byte
	now        func() time.Time
}

// New creates a CA from opts.
func New(opts Options) (*CA, error) {
	c := &CA{td: opts.TrustDomain, defaultTTL: opts.DefaultTTL, now: opts.Now}
	if c.td == "" {
		c.td = identity.DefaultTrustDomain
	}
	if c.defaultTTL <= 0 {
		c.defaultTTL = DefaultTTL
	}
	if c.now == nil {
		c.now = time.Now
	}
	switch {
	case opts.RootCertPEM == nil && opts.RootKeyPEM == nil:
		if err := c.generateRoot(); err != nil {
			return nil, err
		}
	case opts.RootCertPEM != nil && opts.RootKeyPEM != nil:
		if err := c.loadRoot(opts.RootCertPEM, opts.RootKeyPEM); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("ca: root certificate and key must be given together")
	}
	return c, nil
}

func (c *CA) generateRoot() error {
	key, err := identity.GenerateKey()
	if err != nil {
		return fmt.Errorf("ca: generate root key: %w", err)
	}
	now := c.now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{Organization: []string{c.td}, CommonName: "ztunnel-go root CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return fmt.Errorf("ca: self-sign root: %w", err)
	}
	root, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("ca: parse new root: %w", err)
	}
	c.root, c.rootKey = root, key
	c.rootPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return nil
}

func (c *CA) loadRoot(certPEM, keyPEM []byte) error {
	certs, err := identity.ParseCertificatesPEM(certPEM)
	if err != nil {
		return fmt.Errorf("ca: root certificate: %w", err)
	}
	root := certs[0]
	if !root.IsCA {
		return errors.New("ca: root certificate is not a CA (basicConstraints CA:FALSE)")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return errors.New("ca: root key: no PEM block")
	}
	var key any
	switch kb.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(kb.Bytes)
	default:
		return fmt.Errorf("ca: root key: unsupported PEM block %q", kb.Type)
	}
	if err != nil {
		return fmt.Errorf("ca: root key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return errors.New("ca: root key is not a signing key")
	}
	if !publicKeysEqual(root.PublicKey, signer.Public()) {
		return errors.New("ca: root key does not match the root certificate")
	}
	c.root, c.rootKey = root, signer
	c.rootPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw})
	return nil
}

// TrustDomain returns the CA's trust domain.
func (c *CA) TrustDomain() string { return c.td }

// RootPEM returns the trust bundle in PEM.
func (c *CA) RootPEM() []byte { return append([]byte(nil), c.rootPEM...) }

// Root returns the root certificate.
func (c *CA) Root() *x509.Certificate { return c.root }

// RootKeyPEM returns the root's private key in PKCS#8 PEM, so a generated
// root can be persisted and loaded again.
func (c *CA) RootKeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(c.rootKey)
	if err != nil {
		return nil, fmt.Errorf("ca: marshal root key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Sign validates csrPEM and issues a certificate for id, valid for ttl
// (<=0 means the default; capped at MaxTTL). The CSR must be self-signed with
// an ECDSA P-256 key and, if it names a URI SAN, name exactly id. id must be
// in the CA's trust domain. The result is the chain leaf first, root last.
func (c *CA) Sign(csrPEM []byte, id identity.Identity, ttl time.Duration) ([]string, error) {
	if id.TrustDomain != c.td {
		return nil, fmt.Errorf("ca: identity %s is outside trust domain %q", id, c.td)
	}
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("ca: %w: no PEM CERTIFICATE REQUEST block", ErrBadCSR)
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("ca: %w: %v", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("ca: %w: signature: %v", ErrBadCSR, err)
	}
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, fmt.Errorf("ca: %w: key must be ECDSA P-256", ErrBadCSR)
	}
	if len(csr.URIs) > 1 || len(csr.DNSNames)+len(csr.EmailAddresses)+len(csr.IPAddresses) > 0 {
		return nil, fmt.Errorf("ca: %w: want exactly one URI SAN and no other SANs", ErrBadCSR)
	}
	if len(csr.URIs) == 1 && csr.URIs[0].String() != id.String() {
		return nil, fmt.Errorf("ca: %w: CSR asks for %s but caller is authorized for %s", ErrBadCSR, csr.URIs[0], id)
	}
	if ttl <= 0 {
		ttl = c.defaultTTL
	}
	if ttl > MaxTTL {
		ttl = MaxTTL
	}
	u, err := url.Parse(id.String())
	if err != nil {
		return nil, fmt.Errorf("ca: identity %q: %w", id, err)
	}
	now := c.now()
	notAfter := now.Add(ttl)
	if notAfter.After(c.root.NotAfter) {
		notAfter = c.root.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		NotBefore:    now,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
		// The SAN is the only name; mark it critical as the subject is empty.
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.root, pub, c.rootKey)
	if err != nil {
		return nil, fmt.Errorf("ca: sign %s: %w", id, err)
	}
	leafPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return []string{string(leafPEM), string(c.rootPEM)}, nil
}

// Issue generates a key and a certificate for id in one step: what tests,
// benchmarks and the embedded local mesh use instead of a CSR round trip.
func (c *CA) Issue(id identity.Identity, ttl time.Duration) (*identity.WorkloadCertificate, error) {
	key, err := identity.GenerateKey()
	if err != nil {
		return nil, fmt.Errorf("ca: key for %s: %w", id, err)
	}
	csr, err := identity.NewCSR(id, key)
	if err != nil {
		return nil, err
	}
	chain, err := c.Sign(csr, id, ttl)
	if err != nil {
		return nil, err
	}
	return identity.FromChain(id, key, chain)
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("ca: crypto/rand failed: %v", err))
	}
	return n.Add(n, big.NewInt(1))
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}
