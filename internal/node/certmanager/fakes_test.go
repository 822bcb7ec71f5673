package certmanager

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// waitTimeout bounds every testkit.Eventually here (bounded, not a timing
// assertion).
const waitTimeout = 10 * time.Second

// fakeClock is a manual Clock: time moves only on Advance, which fires due
// timers. It records every timer's duration so tests can check refresh and
// backoff schedules exactly.
type fakeClock struct {
	mu        sync.Mutex
	now       time.Time
	timers    map[*fakeTimer]struct{}
	durations []time.Duration
	changed   chan struct{} // closed and replaced whenever timers changes
}

type fakeTimer struct {
	c     *fakeClock
	ch    chan time.Time
	at    time.Time
	fired bool
}

func newFakeClock() *fakeClock {
	// Whole seconds: certificate times have second resolution.
	return &fakeClock{
		now:     time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
		timers:  map[*fakeTimer]struct{}{},
		changed: make(chan struct{}),
	}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1), at: c.now.Add(d)}
	c.durations = append(c.durations, d)
	if d <= 0 {
		t.fired = true
		t.ch <- c.now
		return t
	}
	c.timers[t] = struct{}{}
	c.notifyLocked()
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.fired {
		return false
	}
	t.fired = true
	delete(t.c.timers, t)
	t.c.notifyLocked()
	return true
}

func (c *fakeClock) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Advance moves time forward and fires every timer now due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for t := range c.timers {
		if !t.at.After(c.now) {
			t.fired = true
			t.ch <- c.now
			delete(c.timers, t)
		}
	}
	c.notifyLocked()
}

// waitTimers waits until exactly n timers are pending and returns the
// duration of the most recently created one.
func (c *fakeClock) waitTimers(t *testing.T, n int) time.Duration {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		c.mu.Lock()
		got, ch := len(c.timers), c.changed
		var last time.Duration
		if len(c.durations) > 0 {
			last = c.durations[len(c.durations)-1]
		}
		c.mu.Unlock()
		if got == n {
			return last
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("waited 10s for %d pending timers, have %d", n, got)
		}
	}
}

// fakeCA is an in-process Requester backed by a real ca.CA.
type fakeCA struct {
	ca       *ca.CA
	ttl      time.Duration
	calls    atomic.Int64
	inflight atomic.Int64
	maxIn    atomic.Int64
	fail     atomic.Bool
	// gate, when non-nil, holds every request until it is closed.
	gate chan struct{}
	// signAs, when set, makes the CA sign for this identity instead.
	signAs atomic.Pointer[identity.Identity]
}

var errCADown = errors.New("ca is down")

func newFakeCA(t *testing.T, now func() time.Time, ttl time.Duration) *fakeCA {
	t.Helper()
	authority, err := ca.New(ca.Options{TrustDomain: "cluster.local", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return &fakeCA{ca: authority, ttl: ttl}
}

func (f *fakeCA) Request(ctx context.Context, id identity.Identity, csrPEM []byte) ([]string, error) {
	f.calls.Add(1)
	n := f.inflight.Add(1)
	defer f.inflight.Add(-1)
	for {
		m := f.maxIn.Load()
		if n <= m || f.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if f.fail.Load() {
		return nil, errCADown
	}
	if as := f.signAs.Load(); as != nil {
		// A misbehaving CA: a certificate for someone else, with another key.
		key, err := identity.GenerateKey()
		if err != nil {
			return nil, err
		}
		if csrPEM, err = identity.NewCSR(*as, key); err != nil {
			return nil, err
		}
		id = *as
	}
	return f.ca.Sign(csrPEM, id, f.ttl)
}
