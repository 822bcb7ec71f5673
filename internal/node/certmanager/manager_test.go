package certmanager

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

var (
	idA = identity.MustNew("cluster.local", "default", "a")
	idB = identity.MustNew("cluster.local", "default", "b")
	idC = identity.MustNew("cluster.local", "other", "c")
)

type harness struct {
	m     *Manager
	clock *fakeClock
	ca    *fakeCA
	reg   *prometheus.Registry
	logs  *observer.ObservedLogs
}

// newHarness builds a Manager on a fake clock and a fake CA issuing ttl certs.
func newHarness(t *testing.T, ttl time.Duration, gate chan struct{}) *harness {
	t.Helper()
	clock := newFakeClock()
	fca := newFakeCA(t, clock.Now, ttl)
	fca.gate = gate
	core, logs := observer.New(zapcore.DebugLevel)
	reg := prometheus.NewRegistry()
	m, err := New(Config{}, Deps{Requester: fca, Clock: clock, Logger: zap.New(core), Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return &harness{m: m, clock: clock, ca: fca, reg: reg, logs: logs}
}

func fetch(t *testing.T, m *Manager, id identity.Identity) *identity.WorkloadCertificate {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := m.Fetch(ctx, id)
	if err != nil {
		t.Fatalf("Fetch(%s): %v", id, err)
	}
	if c.Identity != id {
		t.Fatalf("Fetch(%s) returned a certificate for %s", id, c.Identity)
	}
	return c
}

func counter(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ztunnel_cert_fetches_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}, Deps{}); err == nil {
		t.Fatal("New without a Requester succeeded")
	}
	fca := newFakeCA(t, nil, time.Hour)
	if _, err := New(Config{InitialBackoff: time.Minute, MaxBackoff: time.Second}, Deps{Requester: fca}); err == nil {
		t.Fatal("MaxBackoff below InitialBackoff accepted")
	}
	reg := prometheus.NewRegistry()
	m, err := New(Config{}, Deps{Requester: fca, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := New(Config{}, Deps{Requester: fca, Metrics: reg}); err == nil {
		t.Fatal("registering the metrics twice succeeded")
	}
}

func TestFetchCachesAndDumps(t *testing.T) {
	h := newHarness(t, time.Hour, nil)
	start := h.clock.Now()
	c1 := fetch(t, h.m, idA)
	c2 := fetch(t, h.m, idA)
	if c1 != c2 {
		t.Fatal("second Fetch did not return the cached certificate")
	}
	if got := h.ca.calls.Load(); got != 1 {
		t.Fatalf("CA calls = %d, want 1", got)
	}
	if !c1.NotBefore().Equal(start) || !c1.NotAfter().Equal(start.Add(time.Hour)) {
		t.Fatalf("validity %v..%v, want %v + 1h", c1.NotBefore(), c1.NotAfter(), start)
	}
	if d := h.clock.waitTimers(t, 1); d != 30*time.Minute {
		t.Fatalf("refresh scheduled in %v, want 30m (half-life)", d)
	}
	// Reporting happens before the refresh timer is set.
	if got := counter(t, h.reg, "success"); got != 1 {
		t.Fatalf("success counter = %v, want 1", got)
	}

	dump := h.m.Dump()
	if len(dump) != 1 {
		t.Fatalf("dump has %d entries, want 1", len(dump))
	}
	d := dump[0]
	if d.Identity != idA.String() || d.State != StateAvailable || d.LastError != "" {
		t.Fatalf("dump = %+v", d)
	}
	if len(d.CertChain) != 1 || len(d.RootCerts) != 1 {
		t.Fatalf("dump has %d chain and %d root certs, want 1 and 1", len(d.CertChain), len(d.RootCerts))
	}
	leaf := d.CertChain[0]
	if leaf.SerialNumber != c1.Leaf.SerialNumber.String() || // decimal, as Istio ztunnel
		leaf.ValidFrom != start.Format(time.RFC3339) ||
		leaf.ExpirationTime != start.Add(time.Hour).Format(time.RFC3339) ||
		!strings.HasPrefix(leaf.PEM, "-----BEGIN CERTIFICATE-----") {
		t.Fatalf("leaf dump = %+v", leaf)
	}
	if d.NextRefresh != start.Add(30*time.Minute).Format(time.RFC3339) {
		t.Fatalf("nextRefresh = %q", d.NextRefresh)
	}
	if e := h.logs.FilterMessage("certificate fetched").FilterField(zap.String("identity", idA.String())); e.Len() != 1 {
		t.Fatalf("want one 'certificate fetched' log, have %d", e.Len())
	}
}

func TestConcurrentFetchOneRequest(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, time.Hour, gate)
	const n = 16
	results := make([]*identity.WorkloadCertificate, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := h.m.Fetch(ctx, idA)
			if err != nil {
				t.Errorf("Fetch: %v", err)
			}
			results[i] = c
		})
	}
	testkit.Eventually(t, waitTimeout, "the CA request", func() bool { return h.ca.inflight.Load() == 1 })
	close(gate)
	wg.Wait()
	for i, c := range results {
		if c == nil || c != results[0] {
			t.Fatalf("result %d differs from result 0", i)
		}
	}
	if got := h.ca.calls.Load(); got != 1 {
		t.Fatalf("CA calls = %d, want exactly 1", got)
	}
}

func TestFetchBoundedByContext(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, time.Hour, gate)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		testkit.Eventually(t, waitTimeout, "the CA request", func() bool { return h.ca.inflight.Load() == 1 })
		cancel()
	}()
	_, err := h.m.Fetch(ctx, idA)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch err = %v, want context.Canceled", err)
	}
	// The fetch itself goes on and later callers get its result.
	close(gate)
	fetch(t, h.m, idA)
	if got := h.ca.calls.Load(); got != 1 {
		t.Fatalf("CA calls = %d, want 1", got)
	}
}

func TestRefreshAtHalfLife(t *testing.T) {
	h := newHarness(t, time.Hour, nil)
	c1 := fetch(t, h.m, idA)
	h.clock.waitTimers(t, 1)

	h.clock.Advance(30*time.Minute - time.Second)
	if got := h.ca.calls.Load(); got != 1 {
		t.Fatalf("refreshed before half-life: CA calls = %d", got)
	}
	if c := fetch(t, h.m, idA); c != c1 {
		t.Fatal("certificate changed before half-life")
	}

	h.clock.Advance(time.Second)
	h.clock.waitTimers(t, 1) // the next refresh is scheduled once the new cert is in
	c2 := fetch(t, h.m, idA)
	if c2 == c1 {
		t.Fatal("certificate not replaced at half-life")
	}
	now := h.clock.Now()
	if !now.Before(c1.NotAfter()) {
		t.Fatal("old certificate already expired; refresh should come before expiry")
	}
	if !c2.NotBefore().Equal(now) || c2.Leaf.SerialNumber.Cmp(c1.Leaf.SerialNumber) == 0 {
		t.Fatalf("new certificate: notBefore %v serial %v; want %v and a new serial", c2.NotBefore(), c2.Leaf.SerialNumber, now)
	}
	if got := h.ca.calls.Load(); got != 2 {
		t.Fatalf("CA calls = %d, want 2", got)
	}
	if e := h.logs.FilterMessage("certificate refreshed"); e.Len() != 1 {
		t.Fatalf("want one 'certificate refreshed' log, have %d", e.Len())
	}
}

// TestRefreshRealClock runs rotation on the wall clock with 2 s certificates.
func TestRefreshRealClock(t *testing.T) {
	fca := newFakeCA(t, nil, 2*time.Second)
	m, err := New(Config{InitialBackoff: 50 * time.Millisecond}, Deps{Requester: fca})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	c1 := fetch(t, m, idA)
	var c2 *identity.WorkloadCertificate
	testkit.Eventually(t, waitTimeout, "a refreshed certificate", func() bool {
		c2 = fetch(t, m, idA) // fails the test if the old one ever lapsed unreplaced
		return c2 != c1
	})
	if !c2.NotBefore().Before(c1.NotAfter()) {
		t.Fatalf("replacement issued at %v, after the old certificate expired at %v", c2.NotBefore(), c1.NotAfter())
	}
}

func TestCAFailureServesOldCertAndBacksOff(t *testing.T) {
	h := newHarness(t, time.Hour, nil)
	c1 := fetch(t, h.m, idA)
	h.clock.waitTimers(t, 1)

	h.ca.fail.Store(true)
	h.clock.Advance(30 * time.Minute)
	// Each failed attempt schedules the next retry; check the backoff schedule.
	wants := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second}
	for i, want := range wants {
		d := h.clock.waitTimers(t, 1)
		if lo, hi := want*8/10, want*12/10; d < lo || d > hi {
			t.Fatalf("retry %d in %v, want %v ±20%%", i+1, d, want)
		}
		if c := fetch(t, h.m, idA); c != c1 {
			t.Fatalf("retry %d: old certificate not served", i+1)
		}
		dump := h.m.Dump()
		if dump[0].State != StateAvailable || !strings.Contains(dump[0].LastError, errCADown.Error()) {
			t.Fatalf("retry %d: dump = %+v", i+1, dump[0])
		}
		if i < len(wants)-1 {
			h.clock.Advance(d)
		}
	}
	if got := h.ca.calls.Load(); got != int64(1+len(wants)) {
		t.Fatalf("CA calls = %d, want %d", got, 1+len(wants))
	}
	if got := counter(t, h.reg, "failure"); got != float64(len(wants)) {
		t.Fatalf("failure counter = %v, want %d", got, len(wants))
	}
	warns := h.logs.FilterLevelExact(zapcore.WarnLevel)
	if warns.Len() != 1 || !strings.Contains(warns.All()[0].ContextMap()["error"].(string), errCADown.Error()) {
		t.Fatalf("want one warning for the failure streak, have %v", warns.All())
	}

	// Recovery.
	h.ca.fail.Store(false)
	h.clock.Advance(5 * time.Second)
	// Certificate times have second resolution, so the half-life is up to 1 s early.
	if d := h.clock.waitTimers(t, 1); d > 30*time.Minute || d <= 30*time.Minute-time.Second {
		t.Fatalf("after recovery the refresh is in %v, want 30m (-1s)", d)
	}
	c2 := fetch(t, h.m, idA)
	if c2 == c1 {
		t.Fatal("certificate not replaced after recovery")
	}
	if d := h.m.Dump()[0]; d.LastError != "" || d.State != StateAvailable {
		t.Fatalf("dump after recovery = %+v", d)
	}
	if e := h.logs.FilterMessage("certificate fetch recovered"); e.Len() != 1 {
		t.Fatalf("want one recovery log, have %d", e.Len())
	}
	// A new streak warns again.
	h.ca.fail.Store(true)
	h.clock.Advance(30 * time.Minute)
	h.clock.waitTimers(t, 1)
	if got := h.logs.FilterLevelExact(zapcore.WarnLevel).Len(); got != 2 {
		t.Fatalf("warnings = %d, want 2 after a second streak", got)
	}
}

func TestExpiredCertificateFailsClearly(t *testing.T) {
	h := newHarness(t, time.Hour, nil)
	c1 := fetch(t, h.m, idA)
	h.clock.waitTimers(t, 1)
	h.ca.fail.Store(true)
	h.clock.Advance(30 * time.Minute)
	h.clock.waitTimers(t, 1)
	// Jump past expiry without firing the pending retry.
	h.clock.mu.Lock()
	h.clock.now = c1.NotAfter()
	h.clock.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.m.Fetch(ctx, idA)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errCADown) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Fetch err = %v, want ErrUnavailable wrapping the CA error and saying expired", err)
	}
	if d := h.m.Dump()[0]; d.State != StateUnavailable {
		t.Fatalf("state = %q, want %q", d.State, StateUnavailable)
	}
}

func TestFirstFetchFailure(t *testing.T) {
	h := newHarness(t, time.Hour, nil)
	h.ca.fail.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.m.Fetch(ctx, idA)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errCADown) {
		t.Fatalf("Fetch err = %v, want ErrUnavailable wrapping the CA error", err)
	}
	h.clock.waitTimers(t, 1)
	// Fails fast during backoff, without another CA request.
	if _, err := h.m.Fetch(ctx, idA); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("second Fetch err = %v", err)
	}
	if got := h.ca.calls.Load(); got != 1 {
		t.Fatalf("CA calls = %d, want 1", got)
	}
	h.ca.fail.Store(false)
	h.clock.Advance(time.Second)
	h.clock.waitTimers(t, 1)
	fetch(t, h.m, idA)
}

func TestBadCAAnswers(t *testing.T) {
	tests := []struct {
		name    string
		req     RequesterFunc
		wantErr string
	}{
		{"wrong identity", nil, "leaf carries " + idB.String()},
		{"no chain", func(context.Context, identity.Identity, []byte) ([]string, error) { return nil, nil }, "want leaf and root"},
		{"garbage", func(context.Context, identity.Identity, []byte) ([]string, error) {
			return []string{"leaf", "root"}, nil
		}, "no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newFakeClock()
			var req Requester = tt.req
			if tt.req == nil {
				fca := newFakeCA(t, clock.Now, time.Hour)
				fca.signAs.Store(&idB)
				req = fca
			}
			m, err := New(Config{}, Deps{Requester: req, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			_, err = m.Fetch(context.Background(), idA)
			if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Fetch err = %v, want ErrUnavailable containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestForgetStopsRefresh(t *testing.T) {
	h := newHarness(t, time.Hour, nil)
	h.m.Track(idA)
	h.clock.waitTimers(t, 1) // fetched, refresh scheduled
	h.m.Forget(idA)
	h.clock.waitTimers(t, 0) // the refresh timer was stopped
	h.clock.Advance(2 * time.Hour)
	if got := h.ca.calls.Load(); got != 1 {
		t.Fatalf("CA calls = %d after Forget, want 1", got)
	}
	if d := h.m.Dump(); len(d) != 0 {
		t.Fatalf("dump after Forget = %+v", d)
	}
}

func TestForgetWakesWaiters(t *testing.T) {
	gate := make(chan struct{})
	defer close(gate)
	h := newHarness(t, time.Hour, gate)
	errc := make(chan error, 1)
	go func() {
		_, err := h.m.Fetch(context.Background(), idA)
		errc <- err
	}()
	testkit.Eventually(t, waitTimeout, "the CA request", func() bool { return h.ca.inflight.Load() == 1 })
	h.m.Forget(idA)
	if err := <-errc; !errors.Is(err, ErrForgotten) {
		t.Fatalf("Fetch err = %v, want ErrForgotten", err)
	}
	// The in-flight request was cancelled.
	testkit.Eventually(t, waitTimeout, "the cancelled request", func() bool { return h.ca.inflight.Load() == 0 })
}

func TestSetWanted(t *testing.T) {
	h := newHarness(t, time.Hour, nil)
	h.m.SetWanted([]identity.Identity{idA, idB, {}})
	h.clock.waitTimers(t, 2)
	h.m.SetWanted([]identity.Identity{idB, idC, idC})
	var got []string
	testkit.Eventually(t, waitTimeout, "b and c available", func() bool {
		got = got[:0]
		for _, d := range h.m.Dump() {
			if d.State != StateAvailable {
				return false
			}
			got = append(got, d.Identity)
		}
		return true
	})
	if want := []string{idB.String(), idC.String()}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("tracked = %v, want %v", got, want)
	}
	if calls := h.ca.calls.Load(); calls != 3 {
		t.Fatalf("CA calls = %d, want 3 (b kept its certificate)", calls)
	}
}

func TestConcurrencyLimit(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, time.Hour, gate)
	var ids []identity.Identity
	for i := range 20 {
		ids = append(ids, identity.MustNew("cluster.local", "ns", fmt.Sprintf("sa-%d", i)))
	}
	h.m.SetWanted(ids)
	testkit.Eventually(t, waitTimeout, "8 requests in flight", func() bool { return h.ca.inflight.Load() == DefaultMaxConcurrentFetches })
	close(gate)
	for _, id := range ids {
		fetch(t, h.m, id)
	}
	if got := h.ca.maxIn.Load(); got != DefaultMaxConcurrentFetches {
		t.Fatalf("max concurrent CA requests = %d, want %d", got, DefaultMaxConcurrentFetches)
	}
	if got := h.ca.calls.Load(); got != 20 {
		t.Fatalf("CA calls = %d, want 20", got)
	}
}

func TestClose(t *testing.T) {
	gate := make(chan struct{})
	defer close(gate)
	h := newHarness(t, time.Hour, gate)
	errc := make(chan error, 1)
	go func() {
		_, err := h.m.Fetch(context.Background(), idA)
		errc <- err
	}()
	testkit.Eventually(t, waitTimeout, "the CA request", func() bool { return h.ca.inflight.Load() == 1 })
	if err := h.m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("waiting Fetch err = %v, want ErrClosed", err)
	}
	if _, err := h.m.Fetch(context.Background(), idA); !errors.Is(err, ErrClosed) {
		t.Fatalf("Fetch after Close err = %v, want ErrClosed", err)
	}
	h.m.Track(idB)
	if d := h.m.Dump(); len(d) != 0 {
		t.Fatalf("dump after Close = %+v", d)
	}
}

func TestBackoffDelay(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		failures int
		r        float64
		want     time.Duration
	}{
		{0, 0.5, 500 * ms},
		{1, 0, 400 * ms},
		{1, 0.5, 500 * ms},
		{1, 1, 600 * ms},
		{2, 0.5, 1000 * ms},
		{3, 0, 1600 * ms},
		{9, 0.5, 128 * time.Second},
		{9, 1, 150 * time.Second}, // 153.6 s capped
		{10, 0, 120 * time.Second},
		{10, 0.5, 150 * time.Second},
		{1000, 0.5, 150 * time.Second},
	}
	for _, tt := range tests {
		if got := backoffDelay(tt.failures, DefaultInitialBackoff, DefaultMaxBackoff, tt.r); got != tt.want {
			t.Errorf("backoffDelay(%d, r=%v) = %v, want %v", tt.failures, tt.r, got, tt.want)
		}
	}
}
