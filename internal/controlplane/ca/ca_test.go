package ca_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

func csrFor(t *testing.T, uris []string, key any) []byte {
	t.Helper()
	var us []*url.URL
	for _, s := range uris {
		u, _ := url.Parse(s)
		us = append(us, u)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: us}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func TestSignIssuesWorkloadCert(t *testing.T) {
	c, err := ca.New(ca.Options{TrustDomain: "example.org"})
	if err != nil {
		t.Fatal(err)
	}
	id := identity.MustNew("example.org", "ns", "sa")
	key, _ := identity.GenerateKey()
	chain, err := c.Sign(csrFor(t, []string{id.String()}, key), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 || chain[1] != string(c.RootPEM()) {
		t.Fatalf("chain must be leaf then root; got %d elements", len(chain))
	}
	leaf, _ := identity.ParseCertificatesPEM([]byte(chain[0]))
	l := leaf[0]
	if len(l.URIs) != 1 || l.URIs[0].String() != id.String() || len(l.DNSNames) != 0 {
		t.Fatalf("SANs: %v %v", l.URIs, l.DNSNames)
	}
	if l.PublicKeyAlgorithm != x509.ECDSA || l.NotAfter.Sub(l.NotBefore) != ca.DefaultTTL {
		t.Fatalf("alg %v ttl %v", l.PublicKeyAlgorithm, l.NotAfter.Sub(l.NotBefore))
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.Root())
	if _, err := l.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("leaf does not verify as client cert: %v", err)
	}
	if _, err := l.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("leaf does not verify as server cert: %v", err)
	}
}

func TestSignRejects(t *testing.T) {
	c, _ := ca.New(ca.Options{})
	id := identity.MustNew("cluster.local", "ns", "sa")
	ecKey, _ := identity.GenerateKey()
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	tests := []struct {
		name string
		csr  []byte
		id   identity.Identity
		want string
	}{
		{"garbage", []byte("not a csr"), id, "no PEM"},
		{"bad der", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte{1, 2, 3}}), id, "invalid certificate signing request"},
		{"p384", csrFor(t, []string{id.String()}, p384), id, "P-256"},
		{"rsa", csrFor(t, []string{id.String()}, rsaKey), id, "P-256"},
		{"two sans", csrFor(t, []string{id.String(), "spiffe://cluster.local/ns/x/sa/y"}, ecKey), id, "exactly one URI SAN"},
		{"other identity", csrFor(t, []string{"spiffe://cluster.local/ns/x/sa/y"}, ecKey), id, "authorized for"},
		{"foreign trust domain", csrFor(t, []string{"spiffe://evil.org/ns/ns/sa/sa"}, ecKey), identity.MustNew("evil.org", "ns", "sa"), "outside trust domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Sign(tt.csr, tt.id, 0)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want containing %q", err, tt.want)
			}
		})
	}
	_, err := c.Sign([]byte("x"), id, 0)
	if !errors.Is(err, ca.ErrBadCSR) {
		t.Fatalf("err %v is not ErrBadCSR", err)
	}
}

func TestTTLCapAndNow(t *testing.T) {
	past := time.Now().Add(-72 * time.Hour)
	c, _ := ca.New(ca.Options{Now: func() time.Time { return past }})
	id := identity.MustNew("cluster.local", "ns", "sa")
	wc, err := c.Issue(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !wc.NotAfter().Before(time.Now()) {
		t.Fatal("Now option did not mint an expired certificate")
	}
	c2, _ := ca.New(ca.Options{})
	wc2, err := c2.Issue(id, 1000*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if got := wc2.NotAfter().Sub(wc2.NotBefore()); got != ca.MaxTTL {
		t.Fatalf("ttl %v not capped at %v", got, ca.MaxTTL)
	}
}

func TestLoadRootRoundTrip(t *testing.T) {
	c, _ := ca.New(ca.Options{})
	keyPEM, err := c.RootKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	c2, err := ca.New(ca.Options{RootCertPEM: c.RootPEM(), RootKeyPEM: keyPEM})
	if err != nil {
		t.Fatal(err)
	}
	id := identity.MustNew("cluster.local", "ns", "sa")
	wc, err := c2.Issue(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.Root())
	if _, err := wc.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("cert from reloaded CA does not chain to original root: %v", err)
	}
	other, _ := ca.New(ca.Options{})
	otherKey, _ := other.RootKeyPEM()
	if _, err := ca.New(ca.Options{RootCertPEM: c.RootPEM(), RootKeyPEM: otherKey}); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatched key accepted: %v", err)
	}
	if _, err := ca.New(ca.Options{RootCertPEM: c.RootPEM()}); err == nil {
		t.Fatal("cert without key accepted")
	}
	if _, err := ca.New(ca.Options{RootCertPEM: []byte("junk"), RootKeyPEM: keyPEM}); err == nil {
		t.Fatal("junk cert accepted")
	}
}
