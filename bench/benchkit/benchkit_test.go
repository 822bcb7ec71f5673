package benchkit

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// HAProxy's crt file must load as a certificate chain with its key, the
// chain HBONE sends (leaf, root).
func TestCertKeyPEM(t *testing.T) {
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wc, err := c.Issue(identity.MustNew("cluster.local", "bench", "server"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := CertKeyPEM(wc)
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

// A child issues from the root its parent wrote: same trust domain, and
// the child's certificates verify against the parent's root.
func TestWriteLoadCA(t *testing.T) {
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := WriteCA(c, dir); err != nil {
		t.Fatal(err)
	}
	c2, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := c2.Issue(identity.MustNew(c.TrustDomain(), "bench", "client"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(c.Root())
	if _, err := wc.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("a certificate of the loaded CA does not verify against the written root: %v", err)
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
		if got := Percentile(d, c.p); got != c.want {
			t.Errorf("Percentile(1..100, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("Median odd = %v", got)
	}
	if got := Median([]float64{4, 1, 2, 3}); got != 2.5 {
		t.Errorf("Median even = %v", got)
	}
}

func rusage() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// CPU reads the same accounting as getrusage, in 10 ms ticks; Status has
// this process's resident memory.
func TestCPUAndStatus(t *testing.T) {
	before, err := CPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ru0 := rusage()
	for deadline := time.Now().Add(20 * time.Second); rusage()-ru0 < 200*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatal("could not spin 200 ms of CPU in 20 s")
		}
	}
	ru := rusage() - ru0
	after, err := CPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := after - before; got < ru-50*time.Millisecond || got > ru+50*time.Millisecond {
		t.Fatalf("/proc stat counted %v while getrusage counted %v", got, ru)
	}
	if _, err := CPU(-1); err == nil {
		t.Fatal("CPU(-1) did not fail")
	}
	st, err := Status(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st["VmRSS"] <= 0 || st["VmHWM"] < st["VmRSS"] || st["Threads"] < 1 {
		t.Fatalf("Status: VmRSS %d kB, VmHWM %d kB, Threads %d", st["VmRSS"], st["VmHWM"], st["Threads"])
	}
}

// Paced keeps the rate and spreads the calls over the workers; a worker
// that fails stops and its error is returned.
func TestPaced(t *testing.T) {
	var calls [4]atomic.Int64
	lats, wall, err := Paced(4, 200, 500*time.Millisecond, func(i int) error {
		calls[i].Add(1)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(lats); n < 90 || n > 101 {
		t.Errorf("%d calls in %v at 200/s over 0.5 s, want about 100", n, wall)
	}
	for i := range calls {
		if n := calls[i].Load(); n < 20 || n > 26 {
			t.Errorf("worker %d made %d calls, want about 25", i, n)
		}
	}
	boom := errors.New("boom")
	_, _, err = Paced(2, 100, 200*time.Millisecond, func(i int) error {
		if i == 1 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("Paced = %v, want the worker's error", err)
	}
}

func TestWithHeapProfile(t *testing.T) {
	for in, want := range map[string]string{
		"":                      "memprofilerate=524288",
		"gctrace=1":             "gctrace=1,memprofilerate=524288",
		"memprofilerate=256":    "memprofilerate=256",
		"a=1, memprofilerate=0": "a=1, memprofilerate=0",
	} {
		if got := WithHeapProfile(in); got != want {
			t.Errorf("WithHeapProfile(%q) = %q, want %q", in, got, want)
		}
	}
}
