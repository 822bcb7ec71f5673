package hbone

import (
	"crypto/x509"
	"testing"
	"time"
)

func TestVerifyCache(t *testing.T) {
	m := newMesh(t)
	chain := []*x509.Certificate{m.client.Leaf}
	roots := m.client.Roots
	vc := newVerifyCache()
	k := vc.key(chain, roots, x509.ExtKeyUsageClientAuth)
	now := time.Now()
	if vc.hit(k, now) {
		t.Fatal("hit before any verification")
	}
	if err := verifyChain(chain, roots, x509.ExtKeyUsageClientAuth, vc); err != nil {
		t.Fatal(err)
	}
	if !vc.hit(k, now) {
		t.Error("verified chain not cached")
	}
	// The cached answer holds only inside the chain's validity window.
	if vc.hit(k, m.client.Leaf.NotAfter.Add(time.Second)) || vc.hit(k, m.client.Leaf.NotBefore.Add(-time.Second)) {
		t.Error("cache hit outside the certificate's validity")
	}
	// Another bundle, another usage, or another certificate: a miss.
	other := newMesh(t)
	for name, k2 := range map[string]verifyKey{
		"roots": vc.key(chain, other.client.Roots, x509.ExtKeyUsageClientAuth),
		"usage": vc.key(chain, roots, x509.ExtKeyUsageServerAuth),
		"leaf":  vc.key([]*x509.Certificate{m.server.Leaf}, roots, x509.ExtKeyUsageClientAuth),
	} {
		if vc.hit(k2, now) {
			t.Errorf("hit with a different %s", name)
		}
	}
	// A chain that fails is never cached, and failing twice fails twice.
	for range 2 {
		if err := verifyChain(chain, other.client.Roots, x509.ExtKeyUsageClientAuth, vc); err == nil {
			t.Fatal("chain verified against a foreign bundle")
		}
	}
	var nilCache *verifyCache
	if err := verifyChain(chain, roots, x509.ExtKeyUsageClientAuth, nilCache); err != nil {
		t.Errorf("nil cache: %v", err)
	}
}
