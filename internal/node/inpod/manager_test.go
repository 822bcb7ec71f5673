package inpod

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
)

// fakeProxy records what the manager does to it.
type fakeProxy struct {
	w       Workload
	nsID    netns.ID
	served  chan struct{} // closed when Serve is called
	drained chan struct{} // closed when Drain is called
	closed  chan struct{} // closed when Close is called
	// holdDrain, when non-nil, blocks Drain until it is closed.
	holdDrain chan struct{}
	deadline  time.Duration
}

func (p *fakeProxy) Serve(ctx context.Context) error {
	close(p.served)
	select {
	case <-ctx.Done():
	case <-p.closed:
	}
	return nil
}

func (p *fakeProxy) Drain(_ context.Context, d time.Duration) {
	p.deadline = d
	close(p.drained)
	if p.holdDrain != nil {
		<-p.holdDrain
	}
}

func (p *fakeProxy) Close() error { close(p.closed); return nil }

func (p *fakeProxy) isDrained() bool { return isClosed(p.drained) }
func (p *fakeProxy) isClosed() bool  { return isClosed(p.closed) }

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// fakeFactory starts fakeProxies; uids in fail fail to start.
type fakeFactory struct {
	mu        sync.Mutex
	fail      map[string]error
	holdDrain chan struct{}
	proxies   []*fakeProxy
}

func (f *fakeFactory) NewProxy(w Workload, ns *netns.Handle) (Proxy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[w.UID]; err != nil {
		return nil, err
	}
	p := &fakeProxy{w: w, nsID: ns.ID(), served: make(chan struct{}), drained: make(chan struct{}),
		closed: make(chan struct{}), holdDrain: f.holdDrain}
	f.proxies = append(f.proxies, p)
	return p, nil
}

func (f *fakeFactory) setFail(uid string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail == nil {
		f.fail = map[string]error{}
	}
	if err == nil {
		delete(f.fail, uid)
	} else {
		f.fail[uid] = err
	}
}

func (f *fakeFactory) started() []*fakeProxy {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeProxy(nil), f.proxies...)
}

func newManager(t *testing.T, f *fakeFactory) (*Manager, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(Config{DrainDeadline: 3 * time.Second}, Deps{Factory: f, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	return m, reg
}

// currentNS opens the test process's own netns: no root needed, and every
// handle has the same ID.
func currentNS(t *testing.T) *netns.Handle {
	t.Helper()
	h, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func info(name string) *zdsapi.WorkloadInfo {
	return &zdsapi.WorkloadInfo{Name: name, Namespace: "ns1", ServiceAccount: "sa-" + name}
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

func wait(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second): // a hang guard, not a timing assertion
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestAddStartsAndIsIdempotentForSameNetns(t *testing.T) {
	f := &fakeFactory{}
	m, reg := newManager(t, f)
	if err := m.Add("uid-a", info("a"), currentNS(t)); err != nil {
		t.Fatal(err)
	}
	if err := m.Add("uid-a", info("a"), currentNS(t)); err != nil {
		t.Fatalf("second add in the same netns: %v", err)
	}
	ps := f.started()
	if len(ps) != 1 {
		t.Fatalf("started %d proxies, want 1", len(ps))
	}
	wait(t, ps[0].served, "Serve")
	if want := (Workload{UID: "uid-a", Name: "a", Namespace: "ns1", ServiceAccount: "sa-a"}); ps[0].w != want {
		t.Errorf("workload = %+v, want %+v", ps[0].w, want)
	}
	if ps[0].isDrained() || ps[0].isClosed() {
		t.Error("idempotent add touched the running proxy")
	}
	if got := gauge(t, reg, "workload_manager_active_proxy_count"); got != 1 {
		t.Errorf("active = %v, want 1", got)
	}
	if got := gauge(t, reg, "workload_manager_proxies_started_total"); got != 1 {
		t.Errorf("started = %v, want 1", got)
	}
	d := m.Dump()
	if d.Pods["uid-a"].State != StateUp || d.Pods["uid-a"].Info.Name != "a" {
		t.Errorf("dump = %+v", d)
	}
}

func TestDelDrainsOnlyThatPod(t *testing.T) {
	f := &fakeFactory{}
	m, reg := newManager(t, f)
	for _, u := range []string{"uid-a", "uid-b"} {
		if err := m.Add(u, info(u), currentNS(t)); err != nil {
			t.Fatal(err)
		}
	}
	ps := f.started()
	if err := m.Del("uid-a"); err != nil {
		t.Fatal(err)
	}
	wait(t, ps[0].closed, "Close of the deleted pod's proxy")
	if !ps[0].isDrained() {
		t.Error("deleted proxy was closed without a drain")
	}
	if ps[0].deadline != 3*time.Second {
		t.Errorf("drain deadline = %v, want the configured 3s", ps[0].deadline)
	}
	if ps[1].isDrained() || ps[1].isClosed() {
		t.Error("deleting uid-a touched uid-b")
	}
	if err := m.Del("uid-unknown"); err != nil {
		t.Errorf("del of an unknown uid: %v", err)
	}
	m.drains.Wait()
	if got := gauge(t, reg, "workload_manager_active_proxy_count"); got != 1 {
		t.Errorf("active = %v, want 1", got)
	}
	if got := gauge(t, reg, "workload_manager_proxies_stopped_total"); got != 1 {
		t.Errorf("stopped = %v, want 1", got)
	}
}

func TestDrainingShowsInDumpUntilDone(t *testing.T) {
	hold := make(chan struct{})
	f := &fakeFactory{holdDrain: hold}
	m, _ := newManager(t, f)
	if err := m.Add("uid-a", info("a"), currentNS(t)); err != nil {
		t.Fatal(err)
	}
	if err := m.Del("uid-a"); err != nil {
		t.Fatal(err)
	}
	wait(t, f.started()[0].drained, "Drain")
	d := m.Dump()
	if _, ok := d.Pods["uid-a"]; ok || len(d.Draining) != 1 || d.Draining[0].State != StateDraining {
		t.Errorf("dump while draining = %+v", d)
	}
	close(hold)
	m.drains.Wait()
	if d := m.Dump(); len(d.Draining) != 0 {
		t.Errorf("dump after drain = %+v", d)
	}
}

func TestStartFailureIsPendingAndRetried(t *testing.T) {
	f := &fakeFactory{}
	boom := errors.New("bind: address in use")
	f.setFail("uid-a", boom)
	m, reg := newManager(t, f)
	err := m.Add("uid-a", info("a"), currentNS(t))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "uid-a") {
		t.Fatalf("add error = %v, want a wrapped %v naming the pod", err, boom)
	}
	if got := gauge(t, reg, "workload_manager_pending_proxy_count"); got != 1 {
		t.Errorf("pending = %v, want 1", got)
	}
	d := m.Dump()
	if p := d.Pods["uid-a"]; p.State != StatePending || !strings.Contains(p.LastError, "address in use") {
		t.Errorf("dump = %+v", d)
	}
	// A retry that still fails keeps it pending.
	m.retryPending()
	if len(f.started()) != 0 || m.Dump().Pods["uid-a"].State != StatePending {
		t.Fatal("failing retry changed state")
	}
	f.setFail("uid-a", nil)
	m.retryPending()
	if len(f.started()) != 1 || m.Dump().Pods["uid-a"].State != StateUp {
		t.Fatalf("retry did not start the proxy: %+v", m.Dump())
	}
	if got := gauge(t, reg, "workload_manager_pending_proxy_count"); got != 0 {
		t.Errorf("pending = %v, want 0", got)
	}
}

func TestRunRetriesPending(t *testing.T) {
	f := &fakeFactory{}
	f.setFail("uid-a", errors.New("not yet"))
	m, err := New(Config{RetryInterval: time.Millisecond}, Deps{Factory: f})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown(context.Background())
	_ = m.Add("uid-a", info("a"), currentNS(t))
	if err := m.SnapshotSent([]string{"uid-a"}); err != nil {
		t.Fatal(err)
	}
	if isClosed(m.Ready()) {
		t.Fatal("ready with a proxy pending")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	f.setFail("uid-a", nil)
	wait(t, m.Ready(), "readiness after the retry succeeded")
	if m.Dump().Pods["uid-a"].State != StateUp {
		t.Errorf("dump = %+v", m.Dump())
	}
}

func TestSnapshotDropsUnmentionedAndGatesReadiness(t *testing.T) {
	f := &fakeFactory{}
	m, _ := newManager(t, f)
	if isClosed(m.Ready()) {
		t.Fatal("ready before any snapshot")
	}
	for _, u := range []string{"uid-a", "uid-b", "uid-c"} {
		if err := m.Add(u, info(u), currentNS(t)); err != nil {
			t.Fatal(err)
		}
	}
	f.setFail("uid-d", errors.New("nope"))
	_ = m.Add("uid-d", info("d"), currentNS(t))
	if err := m.Keep("uid-b"); err != nil {
		t.Fatal(err)
	}
	if err := m.Keep("uid-zzz"); err != nil {
		t.Errorf("keep of unknown uid: %v", err)
	}
	// The snapshot mentions a (added) and b (kept) only: c is drained, d
	// (pending) forgotten, and with nothing pending the manager is ready.
	if err := m.SnapshotSent([]string{"uid-a", "uid-b", "uid-zzz"}); err != nil {
		t.Fatal(err)
	}
	ps := f.started()
	wait(t, ps[2].closed, "close of uid-c")
	if ps[0].isClosed() || ps[1].isClosed() {
		t.Error("snapshot stopped a mentioned pod")
	}
	d := m.Dump()
	if len(d.Pods) != 2 || !d.SnapshotReceived {
		t.Errorf("dump = %+v", d)
	}
	wait(t, m.Ready(), "readiness")
}

func TestShutdownDrainsAllAndRefusesAdds(t *testing.T) {
	f := &fakeFactory{}
	m, err := New(Config{}, Deps{Factory: f})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := m.Add(fmt.Sprint("uid-", i), info("p"), currentNS(t)); err != nil {
			t.Fatal(err)
		}
	}
	m.Shutdown(context.Background())
	for _, p := range f.started() {
		if !p.isDrained() || !p.isClosed() {
			t.Errorf("%s: drained=%v closed=%v after Shutdown", p.w.UID, p.isDrained(), p.isClosed())
		}
		if p.deadline != DefaultDrainDeadline {
			t.Errorf("deadline = %v, want default %v", p.deadline, DefaultDrainDeadline)
		}
	}
	if err := m.Add("uid-late", info("late"), currentNS(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("add after shutdown = %v, want ErrClosed", err)
	}
}

func TestNewRequiresFactory(t *testing.T) {
	if _, err := New(Config{}, Deps{}); err == nil {
		t.Fatal("New without a factory succeeded")
	}
	reg := prometheus.NewRegistry()
	if _, err := New(Config{}, Deps{Factory: &fakeFactory{}, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{}, Deps{Factory: &fakeFactory{}, Registerer: reg}); err == nil {
		t.Fatal("registering the metrics twice succeeded")
	}
	if n := testutil.CollectAndCount(reg); n != 4 {
		t.Errorf("registered %d metrics, want 4", n)
	}
}

// A pod that reappears in a different network namespace (its sandbox was
// recreated) gets a new proxy there; the old one drains.
func TestAddInNewNetnsReplacesAndDrainsOld(t *testing.T) {
	roottest.Require(t)
	a, b := netnstest.New(t, "a"), netnstest.New(t, "b")
	f := &fakeFactory{}
	m, reg := newManager(t, f)
	dup := func(ns *netnstest.NS) *netns.Handle {
		h, err := netns.Open("/var/run/netns/" + ns.Name)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if err := m.Add("uid-a", info("a"), dup(a)); err != nil {
		t.Fatal(err)
	}
	if err := m.Add("uid-a", info("a"), dup(b)); err != nil {
		t.Fatal(err)
	}
	ps := f.started()
	if len(ps) != 2 || ps[0].nsID != a.ID() || ps[1].nsID != b.ID() {
		t.Fatalf("proxies = %+v", ps)
	}
	wait(t, ps[0].closed, "close of the old proxy")
	if !ps[0].isDrained() || ps[1].isClosed() {
		t.Error("old proxy not drained, or new one closed")
	}
	m.drains.Wait()
	if got := gauge(t, reg, "workload_manager_active_proxy_count"); got != 1 {
		t.Errorf("active = %v, want 1", got)
	}
	if got := m.Dump().Pods["uid-a"].Netns; got != b.ID().String() {
		t.Errorf("dump netns = %s, want %s", got, b.ID())
	}
}
