package identity_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

func TestParseAndPrint(t *testing.T) {
	tests := []struct {
		in      string
		want    identity.Identity
		wantErr string
	}{
		{in: "spiffe://cluster.local/ns/default/sa/sleep", want: identity.Identity{"cluster.local", "default", "sleep"}},
		{in: "spiffe://example.org/ns/a-b/sa/c.d", want: identity.Identity{"example.org", "a-b", "c.d"}},
		{in: "spiffe://cluster.local/ns/default", wantErr: "not a workload identity"},
		{in: "spiffe://cluster.local/sa/x/ns/y", wantErr: "not a workload identity"},
		{in: "spiffe://cluster.local/ns/a/sa/b/extra", wantErr: "not a workload identity"},
		{in: "https://cluster.local/ns/a/sa/b", wantErr: "parse"},
		{in: "spiffe://UPPER/ns/a/sa/b", wantErr: "parse"},
		{in: "", wantErr: "parse"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := identity.Parse(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) err = %v, want containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("Parse(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
			if got.String() != tt.in {
				t.Fatalf("String() = %q, want %q", got.String(), tt.in)
			}
		})
	}
}

func TestIdentityCompareAndTrustDomain(t *testing.T) {
	a := identity.MustNew("cluster.local", "ns1", "sa1")
	b, _ := identity.Parse("spiffe://cluster.local/ns/ns1/sa/sa1")
	c := identity.MustNew("other.domain", "ns1", "sa1")
	if a != b {
		t.Fatal("equal identities compare unequal")
	}
	if a == c || a.SameTrustDomain(c) || !a.SameTrustDomain(b) {
		t.Fatal("trust domain comparison wrong")
	}
	if !(identity.Identity{}).IsZero() || a.IsZero() {
		t.Fatal("IsZero wrong")
	}
	if _, err := identity.New("cluster.local", "", "sa"); err == nil {
		t.Fatal("empty namespace accepted")
	}
	sid, err := a.SPIFFEID()
	if err != nil || sid.TrustDomain().Name() != "cluster.local" {
		t.Fatalf("SPIFFEID = %v, %v", sid, err)
	}
}

func TestIssueAndFromChain(t *testing.T) {
	authority, err := ca.New(ca.Options{TrustDomain: "cluster.local", DefaultTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	id := identity.MustNew("cluster.local", "default", "client")
	key, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := identity.NewCSR(id, key)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := authority.Sign(csr, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := identity.FromChain(id, key, chain)
	if err != nil {
		t.Fatal(err)
	}
	if wc.Identity != id || len(wc.RootCerts) != 1 {
		t.Fatalf("got %+v", wc)
	}
	if d := wc.NotAfter().Sub(wc.NotBefore()); d != time.Hour {
		t.Fatalf("ttl = %v, want 1h", d)
	}
	if want := wc.NotBefore().Add(30 * time.Minute); !wc.RefreshAt().Equal(want) {
		t.Fatalf("RefreshAt = %v, want %v", wc.RefreshAt(), want)
	}
	got, err := identity.FromCertificate(wc.Leaf)
	if err != nil || got != id {
		t.Fatalf("FromCertificate = %v, %v", got, err)
	}

	// A chain claiming another identity, or for another key, is refused.
	other := identity.MustNew("cluster.local", "default", "server")
	if _, err := identity.FromChain(other, key, chain); err == nil || !strings.Contains(err.Error(), "want "+other.String()) {
		t.Fatalf("identity mismatch not caught: %v", err)
	}
	key2, _ := identity.GenerateKey()
	if _, err := identity.FromChain(id, key2, chain); err == nil || !strings.Contains(err.Error(), "private key") {
		t.Fatalf("key mismatch not caught: %v", err)
	}
	// A chain whose root is another CA's.
	otherCA, _ := ca.New(ca.Options{})
	bad := []string{chain[0], string(otherCA.RootPEM())}
	if _, err := identity.FromChain(id, key, bad); err == nil || !strings.Contains(err.Error(), "chain") {
		t.Fatalf("foreign root not caught: %v", err)
	}
	if _, err := identity.FromChain(id, key, chain[:1]); err == nil {
		t.Fatal("one-element chain accepted")
	}
	if _, err := identity.FromChain(id, key, []string{"garbage", chain[1]}); err == nil {
		t.Fatal("garbage leaf accepted")
	}
}

func TestMultipleRootsInLastElement(t *testing.T) {
	a, _ := ca.New(ca.Options{})
	b, _ := ca.New(ca.Options{})
	id := identity.MustNew("cluster.local", "ns", "sa")
	key, _ := identity.GenerateKey()
	csr, _ := identity.NewCSR(id, key)
	chain, err := a.Sign(csr, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	chain[1] = string(b.RootPEM()) + chain[1]
	wc, err := identity.FromChain(id, key, chain)
	if err != nil {
		t.Fatal(err)
	}
	if len(wc.RootCerts) != 2 {
		t.Fatalf("trust bundle has %d roots, want 2", len(wc.RootCerts))
	}
}

func TestCSRShape(t *testing.T) {
	id := identity.MustNew("cluster.local", "ns", "sa")
	key, _ := identity.GenerateKey()
	csrPEM, err := identity.NewCSR(id, key)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(csrPEM)
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(csr.URIs) != 1 || csr.URIs[0].String() != id.String() || csr.Subject.String() != "" ||
		csr.SignatureAlgorithm != x509.ECDSAWithSHA256 {
		t.Fatalf("CSR shape: uris=%v subject=%q alg=%v", csr.URIs, csr.Subject.String(), csr.SignatureAlgorithm)
	}
	if _, err := identity.NewCSR(identity.Identity{}, key); err == nil {
		t.Fatal("CSR for zero identity accepted")
	}
}

func TestFromCertificateErrors(t *testing.T) {
	if _, err := identity.FromCertificate(&x509.Certificate{}); err == nil {
		t.Fatal("no SAN accepted")
	}
	u, _ := url.Parse("spiffe://cluster.local/workload")
	if _, err := identity.FromCertificate(&x509.Certificate{URIs: []*url.URL{u}}); !errors.Is(err, identity.ErrNotWorkloadID) {
		t.Fatalf("err = %v, want ErrNotWorkloadID", err)
	}
}

func TestStaticSource(t *testing.T) {
	authority, _ := ca.New(ca.Options{})
	id := identity.MustNew("cluster.local", "a", "b")
	wc, err := authority.Issue(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s := identity.NewStaticSource(wc)
	got, err := s.Fetch(context.Background(), id)
	if err != nil || got != wc {
		t.Fatalf("Fetch = %v, %v", got, err)
	}
	if _, err := s.Fetch(context.Background(), identity.MustNew("cluster.local", "x", "y")); err == nil {
		t.Fatal("unknown identity returned a certificate")
	}
}

// TestAssembleRootNewerThanLeafStart: istiod backdates a leaf's NotBefore by
// two minutes but not its root's, so a fresh CA issues leaves that start
// before their root. Such a leaf is usable now and must be accepted; it used
// to be checked at its own start time and refused for two minutes.
func TestAssembleRootNewerThanLeafStart(t *testing.T) {
	now := time.Now()
	rootKey, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	rootTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{Organization: []string{"cluster.local"}},
		NotBefore: now.Add(-10 * time.Second), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	rootDER, err := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	if err != nil {
		t.Fatal(err)
	}
	root, err := x509.ParseCertificate(rootDER)
	if err != nil {
		t.Fatal(err)
	}
	id := identity.MustNew("cluster.local", "default", "client")
	u, _ := url.Parse(id.String())
	leafFor := func(notBefore, notAfter time.Time) (*x509.Certificate, crypto.Signer) {
		key, err := identity.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: big.NewInt(2), NotBefore: notBefore, NotAfter: notAfter, URIs: []*url.URL{u},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}, root, key.Public(), rootKey)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return leaf, key
	}
	leaf, key := leafFor(now.Add(-2*time.Minute), now.Add(time.Hour))
	if _, err := identity.Assemble(id, key, []*x509.Certificate{leaf}, []*x509.Certificate{root}); err != nil {
		t.Fatalf("leaf backdated before its root: %v", err)
	}
	// A leaf that chains to no root is still refused.
	otherKey, _ := identity.GenerateKey()
	otherDER, _ := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, otherKey.Public(), otherKey)
	other, _ := x509.ParseCertificate(otherDER)
	if _, err := identity.Assemble(id, key, []*x509.Certificate{leaf}, []*x509.Certificate{other}); err == nil {
		t.Fatal("leaf accepted against a root that did not sign it")
	}
	// A leaf whose whole life lies outside its root's is refused: there is
	// no moment at which the chain holds.
	early, earlyKey := leafFor(now.Add(-time.Hour), now.Add(-30*time.Minute))
	if _, err := identity.Assemble(id, earlyKey, []*x509.Certificate{early}, []*x509.Certificate{root}); err == nil {
		t.Fatal("leaf that ended before its root began was accepted")
	}
}
