package main

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
)

// HAProxy's crt file must load as a certificate chain with its key, the
// chain HBONE sends (leaf, root).
func TestCertKeyPEM(t *testing.T) {
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wc, err := c.Issue(serverID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := certKeyPEM(wc)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(b, b)
	if err != nil {
		t.Fatalf("X509KeyPair: %v", err)
	}
	if len(pair.Certificate) != len(wc.TLS.Certificate) {
		t.Fatalf("chain of %d certificates, want %d", len(pair.Certificate), len(wc.TLS.Certificate))
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.Equal(wc.Leaf) {
		t.Fatal("first certificate is not the leaf")
	}
}

func TestPercentiles(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50}, {90, 90}, {99, 99}, {100, 100}, {0, 1}} {
		if got := pctl(d, c.p); got != c.want {
			t.Errorf("pctl(1..100, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median odd = %v", got)
	}
	if got := median([]float64{4, 1, 2, 3}); got != 2.5 {
		t.Errorf("median even = %v", got)
	}
}

// procCPU reads the same accounting as getrusage, in 10 ms ticks.
func TestProcCPU(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ru0 := cpuTime()
	for deadline := time.Now().Add(20 * time.Second); cpuTime()-ru0 < 200*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatal("could not spin 200 ms of CPU in 20 s")
		}
	}
	ru := cpuTime() - ru0
	after, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := after - before; got < ru-50*time.Millisecond || got > ru+50*time.Millisecond {
		t.Fatalf("/proc stat counted %v while getrusage counted %v", got, ru)
	}
	if _, err := procCPU(-1); err == nil {
		t.Fatal("procCPU(-1) did not fail")
	}
}
