// Package testpki makes throwaway certificate authorities, leaf certificates
// and CRLs for tests, so a test says what it needs in one line instead of
// filling an x509 template by hand.
// Keys are ECDSA P-256, as the mesh CA's are. Certificates are valid from an
// hour ago to a day ahead unless the template says otherwise, so clock skew
// between the test and the code under test never matters.
// It is test support: it is never linked into a product binary.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// serials hands out certificate serial numbers unique within the process.
// Tests that revoke a certificate name it by serial, so two leaves must
// never share one.
var serials atomic.Int64

func nextSerial() *big.Int { return big.NewInt(serials.Add(1)) }

// CA is a certificate authority: a self-signed root, or an intermediate
// signed by another CA.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// Parent is the CA that signed this one, nil for a root.
	Parent *CA

	crlNumber atomic.Int64
}

// Leaf is a certificate with its key, signed by a CA.
type Leaf struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// Issuer is the CA that signed the leaf.
	Issuer *CA
}

// NewRoot returns a self-signed root whose subject's common name is name.
func NewRoot(t testkit.TB, name string) *CA {
	t.Helper()
	return NewRootSubject(t, pkix.Name{CommonName: name})
}

// NewRootSubject returns a self-signed root with the given subject.
// The mesh CA's root has only an organization, the trust domain.
func NewRootSubject(t testkit.TB, subject pkix.Name) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := caTemplate(subject)
	return &CA{Cert: create(t, tmpl, tmpl, key, key), Key: key}
}

// NewIntermediate returns a CA named name signed by ca.
func (ca *CA) NewIntermediate(t testkit.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	return &CA{Cert: create(t, caTemplate(pkix.Name{CommonName: name}), ca.Cert, key, ca.Key), Key: key, Parent: ca}
}

// Issue signs a leaf from tmpl with a new key.
// Zero fields get defaults: a fresh serial, the usual validity, and
// KeyUsageDigitalSignature.
func (ca *CA) Issue(t testkit.TB, tmpl *x509.Certificate) *Leaf {
	t.Helper()
	fill(tmpl)
	if tmpl.KeyUsage == 0 {
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	}
	key := newKey(t)
	return &Leaf{Cert: create(t, tmpl, ca.Cert, key, ca.Key), Key: key, Issuer: ca}
}

// Server issues a TLS server certificate for hosts: each is an IP address
// or a DNS name.
func (ca *CA) Server(t testkit.TB, hosts ...string) *Leaf {
	t.Helper()
	tmpl := &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if len(hosts) > 0 {
		tmpl.Subject.CommonName = hosts[0]
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.Issue(t, tmpl)
}

// Workload issues a workload certificate as the mesh CA does: its only SAN
// is the URI id, such as spiffe://cluster.local/ns/demo/sa/client, for
// both ends of mutual TLS.
func (ca *CA) Workload(t testkit.TB, id string) *Leaf {
	t.Helper()
	u, err := url.Parse(id)
	if err != nil {
		t.Fatalf("testpki: workload id %q: %v", id, err)
	}
	return ca.Issue(t, &x509.Certificate{URIs: []*url.URL{u},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
}

// CRL returns a PEM CRL signed by ca that revokes serials. Each call gets the
// next CRL number, so a reload can tell a newer list from an older one.
func (ca *CA) CRL(t testkit.TB, serials ...*big.Int) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: ca.CRLDER(t, ca.crlNumber.Add(1), serials...)})
}

// CRLDER returns a DER CRL signed by ca with the given CRL number, for tests
// of how CRL numbers are ordered.
func (ca *CA) CRLDER(t testkit.TB, number int64, serials ...*big.Int) []byte {
	t.Helper()
	now := time.Now()
	rl := &x509.RevocationList{Number: big.NewInt(number),
		ThisUpdate: now.Add(-time.Minute), NextUpdate: now.Add(time.Hour)}
	for _, s := range serials {
		rl.RevokedCertificateEntries = append(rl.RevokedCertificateEntries,
			x509.RevocationListEntry{SerialNumber: s, RevocationTime: now})
	}
	der, err := x509.CreateRevocationList(rand.Reader, rl, ca.Cert, ca.Key)
	if err != nil {
		t.Fatalf("testpki: CRL: %v", err)
	}
	return der
}

// CertPEM is the CA's certificate in PEM.
func (ca *CA) CertPEM() []byte { return certPEM(ca.Cert) }

// KeyPEM is the CA's key in PKCS#8 PEM, as a CA Secret holds it.
func (ca *CA) KeyPEM(t testkit.TB) []byte {
	t.Helper()
	return keyPEM(t, ca.Key)
}

// Pool is a pool holding the root of ca's chain.
func (ca *CA) Pool() *x509.CertPool {
	root := ca
	for root.Parent != nil {
		root = root.Parent
	}
	p := x509.NewCertPool()
	p.AddCert(root.Cert)
	return p
}

// TLS is the leaf as a tls.Certificate, with the intermediates of its chain
// after it and the root left out, as a server sends it.
func (l *Leaf) TLS() tls.Certificate {
	c := tls.Certificate{Certificate: [][]byte{l.Cert.Raw}, PrivateKey: l.Key, Leaf: l.Cert}
	for ca := l.Issuer; ca != nil && ca.Parent != nil; ca = ca.Parent {
		c.Certificate = append(c.Certificate, ca.Cert.Raw)
	}
	return c
}

// CertPEM is the leaf's certificate in PEM, without its chain.
func (l *Leaf) CertPEM() []byte { return certPEM(l.Cert) }

// KeyPEM is the leaf's key in PKCS#8 PEM.
func (l *Leaf) KeyPEM(t testkit.TB) []byte {
	t.Helper()
	return keyPEM(t, l.Key)
}

func caTemplate(subject pkix.Name) *x509.Certificate {
	tmpl := &x509.Certificate{Subject: subject, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	fill(tmpl)
	return tmpl
}

func fill(tmpl *x509.Certificate) {
	if tmpl.SerialNumber == nil {
		tmpl.SerialNumber = nextSerial()
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
}

func newKey(t testkit.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testpki: key: %v", err)
	}
	return key
}

func create(t testkit.TB, tmpl, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		t.Fatalf("testpki: certificate %q: %v", tmpl.Subject.CommonName, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testpki: parse %q: %v", tmpl.Subject.CommonName, err)
	}
	return c
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func keyPEM(t testkit.TB, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("testpki: key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}
