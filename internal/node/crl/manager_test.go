package crl

import (
	"context"
	"crypto/x509"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// fixture is a CRL file, the roots func over a swappable root list, and a
// manager on them.
type fixture struct {
	root   *testCA
	path   string
	roots  atomic.Pointer[[]*x509.Certificate]
	logs   *observer.ObservedLogs
	reg    *prometheus.Registry
	client *x509.Certificate
	server *x509.Certificate
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{root: newRoot(t, "root"), path: filepath.Join(t.TempDir(), "crl.pem"), reg: prometheus.NewRegistry()}
	f.setRoots(f.root.cert)
	f.client = f.root.leaf(t, "spiffe://cluster.local/ns/a/sa/client")
	f.server = f.root.leaf(t, "spiffe://cluster.local/ns/a/sa/server")
	return f
}

func (f *fixture) setRoots(rs ...*x509.Certificate) { f.roots.Store(&rs) }

func (f *fixture) write(t *testing.T, data []byte) {
	t.Helper()
	// As a Kubernetes volume update does: a new file renamed over the old.
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) manager(t *testing.T, poll time.Duration) (*Manager, error) {
	core, logs := observer.New(zap.InfoLevel)
	f.logs, f.reg = logs, prometheus.NewRegistry()
	return New(Config{Path: f.path, Poll: poll}, Deps{
		Roots:      func() ([]*x509.Certificate, error) { return *f.roots.Load(), nil },
		Log:        zap.New(core),
		Registerer: f.reg,
	})
}

func (f *fixture) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func TestNewFirstLoad(t *testing.T) {
	f := newFixture(t)
	if _, err := f.manager(t, 0); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing file: %v, want a read error", err)
	}
	f.write(t, []byte("junk"))
	if _, err := f.manager(t, 0); err == nil || !strings.Contains(err.Error(), f.path) {
		t.Fatalf("junk: %v, want an error naming the file", err)
	}
	f.write(t, pemCRL(newCA(t, "root", nil).crl(t, 1)))
	if _, err := f.manager(t, 0); err == nil || !strings.Contains(err.Error(), "not signed by the mesh trust root of that name") {
		t.Fatalf("CRL of an impostor of the root: %v", err)
	}
	// A CRL whose issuer is no root is an intermediate CA's: it loads and
	// is checked against that intermediate when a peer presents it.
	f.write(t, pemCRL(newRoot(t, "stranger").crl(t, 1)))
	if m, err := f.manager(t, 0); err != nil || m.Dump().CRLs[0].IssuerKind != "intermediate" {
		t.Fatalf("CRL of an intermediate: %v", err)
	}
	f.write(t, nil)
	m, err := f.manager(t, 0)
	if err != nil {
		t.Fatalf("empty file: %v", err)
	}
	if m.Set().Len() != 0 || m.CheckPeer([]*x509.Certificate{f.client}, true) != nil {
		t.Fatal("an empty file revokes nothing")
	}
	if _, err := New(Config{}, Deps{}); err == nil {
		t.Fatal("New without a path")
	}
}

func TestReloadKeepsLastGood(t *testing.T) {
	f := newFixture(t)
	f.write(t, pemCRL(f.root.crl(t, 1)))
	m, err := f.manager(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	chain := []*x509.Certificate{f.client}
	if err := m.CheckPeer(chain, true); err != nil {
		t.Fatalf("before the revocation: %v", err)
	}
	f.write(t, pemCRL(f.root.crl(t, 2, f.client.SerialNumber)))
	if changed, err := m.Reload(); !changed || err != nil {
		t.Fatalf("Reload: %v %v", changed, err)
	}
	err = m.CheckPeer(chain, true)
	var re *RevokedError
	if !errors.As(err, &re) || re.Serial.Cmp(f.client.SerialNumber) != 0 {
		t.Fatalf("after the revocation: %v", err)
	}
	if m.CheckPeer([]*x509.Certificate{f.server}, false) != nil {
		t.Fatal("server is not revoked")
	}
	if got := f.counter(t, "istio_crl_policy_rejections_total", "reporter", "destination", "stage", "handshake"); got != 1 {
		t.Fatalf("handshake rejections = %v, want 1", got)
	}

	bad := map[string][]byte{
		"junk":                    []byte("-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n"),
		"impostor of the root":    pemCRL(newCA(t, "root", nil).crl(t, 3)),
		"certificate not a CRL":   []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
		"good CRL then a bad one": append(pemCRL(f.root.crl(t, 3)), pemCRL(newCA(t, "root", nil).crl(t, 1))...),
	}
	for name, data := range bad {
		f.write(t, data)
		if changed, err := m.Reload(); changed || err == nil {
			t.Fatalf("%s: Reload = %v, %v; want refused", name, changed, err)
		}
		if !errors.Is(m.CheckPeer(chain, true), ErrRevoked) {
			t.Fatalf("%s: the revocation in force was dropped", name)
		}
		if d := m.Dump(); d.LastError == "" || len(d.CRLs) != 1 || d.CRLs[0].Revoked != 1 {
			t.Fatalf("%s: dump %+v", name, d)
		}
	}
	if n := f.logs.FilterMessage("CRL update refused; the CRLs in force stay").Len(); n != len(bad) {
		t.Fatalf("%d refusal lines, want %d", n, len(bad))
	}
	// The same broken content again is not logged again.
	if _, err := m.Reload(); err == nil {
		t.Fatal("still broken")
	}
	if n := f.logs.FilterMessage("CRL update refused; the CRLs in force stay").Len(); n != len(bad) {
		t.Fatalf("a repeated refusal was logged again (%d lines)", n)
	}
	// The file removed: still refused, still enforced.
	os.Remove(f.path)
	if _, err := m.Reload(); err == nil || !errors.Is(m.CheckPeer(chain, true), ErrRevoked) {
		t.Fatalf("removed file: %v", err)
	}
	// A good update with the client no longer listed lifts it.
	f.write(t, pemCRL(f.root.crl(t, 4, f.server.SerialNumber)))
	if changed, err := m.Reload(); !changed || err != nil {
		t.Fatal(changed, err)
	}
	if m.CheckPeer(chain, true) != nil || m.CheckPeer([]*x509.Certificate{f.server}, false) == nil {
		t.Fatal("the newer CRL is not the one in force")
	}
	if d := m.Dump(); d.LastError != "" || d.CRLs[0].Number != "4" {
		t.Fatalf("dump after recovery: %+v", d)
	}
	if got := f.counter(t, "ztunnel_crl_reloads_total", "result", "success"); got != 3 {
		t.Fatalf("successful loads = %v, want 3", got)
	}
}

func TestRootRotation(t *testing.T) {
	f := newFixture(t)
	f.write(t, pemCRL(f.root.crl(t, 1, f.client.SerialNumber)))
	m, err := f.manager(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The roots rotate to a new one with the old root's name and another
	// key: the CRL no longer verifies. It is refused, and the revocations
	// in force stay.
	f.setRoots(newCA(t, "root", nil).cert)
	if changed, _ := m.reloadIfChanged(); changed {
		t.Fatal("a CRL of the old root went in force under a new root of its name")
	}
	if m.Dump().LastError == "" || !errors.Is(m.CheckPeer([]*x509.Certificate{f.client}, true), ErrRevoked) {
		t.Fatalf("after the rotation: %+v", m.Dump())
	}
	// To a root of another name: the old root's CRL is no root's any more,
	// so it is held as an intermediate's, checked against a peer's chain.
	next := newRoot(t, "next root")
	f.setRoots(next.cert)
	if changed, err := m.reloadIfChanged(); !changed || err != nil || m.Dump().CRLs[0].IssuerKind != "intermediate" {
		t.Fatalf("rotation to another name: %v %v %+v", changed, err, m.Dump())
	}
	// Both roots in the bundle (a rotation's overlap): it verifies again
	// and is swapped in, verified against the new bundle.
	f.setRoots(next.cert, f.root.cert)
	if changed, err := m.reloadIfChanged(); err != nil || !changed {
		t.Fatalf("overlap: %v %v", changed, err)
	}
	if m.Dump().LastError != "" || !errors.Is(m.CheckPeer([]*x509.Certificate{f.client}, true), ErrRevoked) {
		t.Fatalf("overlap: %+v", m.Dump())
	}
	// Nothing changed since: nothing is reloaded.
	if changed, err := m.reloadIfChanged(); err != nil || changed {
		t.Fatalf("unchanged: %v %v", changed, err)
	}
}

func TestRunReloadsOnChange(t *testing.T) {
	f := newFixture(t)
	f.write(t, pemCRL(f.root.crl(t, 1)))
	m, err := f.manager(t, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	f.write(t, pemCRL(f.root.crl(t, 2, f.client.SerialNumber)))
	testkit.Eventually(t, 5*time.Second, "Run to pick up the new CRL", func() bool {
		return m.CheckPeer([]*x509.Certificate{f.client}, true) != nil
	})
}

func TestWatchPeerClosesRevoked(t *testing.T) {
	f := newFixture(t)
	f.write(t, pemCRL(f.root.crl(t, 1)))
	m, err := f.manager(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	closed := map[string]error{}
	watch := func(name string, c *x509.Certificate, inbound bool) func() {
		return m.WatchPeer([]*x509.Certificate{c}, identity.MustNew("cluster.local", "a", name), inbound, func(err error) {
			mu.Lock()
			defer mu.Unlock()
			if _, dup := closed[name]; dup {
				t.Errorf("%s revoked twice", name)
			}
			closed[name] = err
		})
	}
	stopClient := watch("client", f.client, true)
	defer stopClient()
	stopServer := watch("server", f.server, false)
	defer stopServer()
	gone := f.root.leaf(t, "spiffe://cluster.local/ns/a/sa/gone")
	watch("gone", gone, true)() // ended before the revocation
	if m.Watched() != 2 {
		t.Fatalf("watched %d, want 2", m.Watched())
	}

	f.write(t, pemCRL(f.root.crl(t, 2, f.client.SerialNumber, gone.SerialNumber)))
	if _, err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(closed) != 1 || !errors.Is(closed["client"], ErrRevoked) {
		t.Fatalf("closed %v, want only client", closed)
	}
	mu.Unlock()
	if m.Watched() != 1 {
		t.Fatalf("watched %d after the sweep, want 1", m.Watched())
	}
	lines := f.logs.FilterMessage("closing connection: peer certificate revoked by CRL").All()
	if len(lines) != 1 {
		t.Fatalf("%d closure lines", len(lines))
	}
	fields := lines[0].ContextMap()
	if fields["serial"] != SerialHex(f.client.SerialNumber) || fields["peer"] != "spiffe://cluster.local/ns/a/sa/client" ||
		fields["direction"] != "inbound" {
		t.Fatalf("closure line fields %v", fields)
	}
	if got := f.counter(t, "istio_crl_policy_rejections_total", "reporter", "destination", "stage", "established"); got != 1 {
		t.Fatalf("established rejections = %v", got)
	}
	// A reload of the same revocation again closes nothing more.
	f.write(t, pemCRL(f.root.crl(t, 3, f.client.SerialNumber, gone.SerialNumber)))
	if _, err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	// A connection registered after the CRL is in force (the handshake
	// raced the reload) is closed at once.
	late := watch("client-late", f.client, false)
	defer late()
	mu.Lock()
	if len(closed) != 2 || !errors.Is(closed["client-late"], ErrRevoked) {
		t.Fatalf("closed %v, want client-late too", closed)
	}
	mu.Unlock()
	if got := f.counter(t, "istio_crl_policy_rejections_total", "reporter", "source", "stage", "established"); got != 1 {
		t.Fatalf("outbound established rejections = %v", got)
	}
	if m.Watched() != 1 {
		t.Fatalf("watched %d, want 1 (server)", m.Watched())
	}
}

// TestWatchRace registers, revokes and stops connections from several
// goroutines while reloads run (go test -race).
func TestWatchRace(t *testing.T) {
	f := newFixture(t)
	f.write(t, nil)
	m, err := f.manager(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	var revoked atomic.Int64
	var wg sync.WaitGroup
	stopAll := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stopAll:
					return
				default:
				}
				stop := m.WatchPeer([]*x509.Certificate{f.client}, identity.Identity{}, true, func(error) { revoked.Add(1) })
				_ = m.CheckPeer([]*x509.Certificate{f.client}, true)
				stop()
			}
		})
	}
	for i := range 20 {
		if i%2 == 0 {
			f.write(t, pemCRL(f.root.crl(t, int64(i+1), f.client.SerialNumber)))
		} else {
			f.write(t, pemCRL(f.root.crl(t, int64(i+1), big.NewInt(1))))
		}
		if _, err := m.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	close(stopAll)
	wg.Wait()
	if m.Watched() != 0 {
		t.Fatalf("%d watchers left after every stop", m.Watched())
	}
	if testutil.CollectAndCount(f.reg) == 0 {
		t.Fatal("no metrics registered")
	}
}
