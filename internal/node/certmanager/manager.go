package certmanager

// Invariants of Manager:
//
//   - Each tracked identity has exactly one entry and one goroutine (run). The
//     goroutine alone starts fetches for it, so there is at most one CA
//     request per identity at a time; Fetch never calls the CA itself, it
//     waits for the goroutine's current attempt.
//   - At most Config.MaxConcurrentFetches CA requests run at once (the sem
//     channel), across all identities.
//   - entry fields are guarded by Manager.mu. entry.attempted is open while
//     entry.fetching is true and is closed exactly once, when that attempt
//     ends or the entry is dropped, whichever comes first.
//   - A WorkloadCertificate is immutable: a refresh swaps the pointer, so the
//     data path keeps using what it got; nothing is done under mu beyond map
//     and field updates (no I/O, no logging).
//   - A dropped entry (Forget, SetWanted without it, Close) is removed from
//     the map and its context cancelled; its goroutine discards whatever its
//     in-flight attempt returns.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// Errors callers may branch on.
var (
	// ErrUnavailable is wrapped when an identity has no valid certificate and
	// no fetch is in progress (its last attempt failed and it is waiting to
	// retry). The last CA error is wrapped too.
	ErrUnavailable = errors.New("certificate unavailable")
	// ErrForgotten is returned to a Fetch whose identity was forgotten while
	// it waited.
	ErrForgotten = errors.New("identity no longer wanted")
	// ErrClosed is returned by Fetch after Close.
	ErrClosed = errors.New("certificate manager closed")
)

// DefaultMaxConcurrentFetches bounds simultaneous CA requests, as Istio's
// ztunnel does.
const DefaultMaxConcurrentFetches = 8

// DefaultRequestTimeout bounds one CA request.
const DefaultRequestTimeout = 30 * time.Second

// Config tunes a Manager. The zero value is Istio's ztunnel behaviour.
type Config struct {
	// MaxConcurrentFetches bounds CA requests in flight; 0 means
	// DefaultMaxConcurrentFetches.
	MaxConcurrentFetches int
	// InitialBackoff is the wait after an identity's first failed fetch; it
	// doubles (±20 % jitter) on each further failure up to MaxBackoff. It is
	// also the shortest wait before a refresh, so a certificate whose
	// half-life has already passed (clock skew with the CA) does not cause a
	// busy loop. 0 means DefaultInitialBackoff.
	InitialBackoff time.Duration
	// MaxBackoff caps the retry wait; 0 means DefaultMaxBackoff.
	MaxBackoff time.Duration
	// RequestTimeout bounds one CA request; 0 means DefaultRequestTimeout.
	RequestTimeout time.Duration
}

// Deps are the Manager's collaborators.
type Deps struct {
	// Requester talks to the CA. Required.
	Requester Requester
	// Clock decides expiry, refresh and retry times; nil means RealClock.
	Clock Clock
	// Logger; nil means no logs.
	Logger *zap.Logger
	// Metrics registers the manager's metrics; nil means none are exported.
	Metrics prometheus.Registerer
}

// Manager fetches, caches and rotates workload certificates. It implements
// identity.CertSource. Create it with New and stop it with Close.
type Manager struct {
	cfg     Config
	req     Requester
	clock   Clock
	log     *zap.Logger
	fetches *prometheus.CounterVec

	sem    chan struct{}
	ctx    context.Context // parent of every entry's context; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per entry goroutine

	mu      sync.Mutex
	entries map[identity.Identity]*entry
	closed  bool
}

var _ identity.CertSource = (*Manager)(nil)

type entry struct {
	id     identity.Identity
	cancel context.CancelFunc

	// Guarded by Manager.mu.
	cert        *identity.WorkloadCertificate // latest good certificate; nil before the first
	fetching    bool                          // an attempt is queued or in flight
	attempted   chan struct{}                 // closed when the current attempt ends (see invariants)
	lastErr     error                         // error of the latest attempt; nil after a success
	failures    int                           // consecutive failed attempts
	nextAttempt time.Time                     // when the next refresh or retry starts; zero while fetching
	dropped     bool
}

// New returns a running Manager with nothing tracked.
func New(cfg Config, deps Deps) (*Manager, error) {
	if deps.Requester == nil {
		return nil, errors.New("certmanager: Deps.Requester is required")
	}
	if cfg.MaxConcurrentFetches <= 0 {
		cfg.MaxConcurrentFetches = DefaultMaxConcurrentFetches
	}
	if cfg.InitialBackoff <= 0 {
		cfg.InitialBackoff = DefaultInitialBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.MaxBackoff < cfg.InitialBackoff {
		return nil, fmt.Errorf("certmanager: MaxBackoff %v is below InitialBackoff %v", cfg.MaxBackoff, cfg.InitialBackoff)
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	m := &Manager{
		cfg:     cfg,
		req:     deps.Requester,
		clock:   deps.Clock,
		log:     deps.Logger,
		sem:     make(chan struct{}, cfg.MaxConcurrentFetches),
		entries: make(map[identity.Identity]*entry),
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ztunnel_cert_fetches_total",
			Help: "Workload certificate requests to the CA, by result (success, failure).",
		}, []string{"result"}),
	}
	if m.clock == nil {
		m.clock = RealClock{}
	}
	if m.log == nil {
		m.log = zap.NewNop()
	}
	if deps.Metrics != nil {
		if err := deps.Metrics.Register(m.fetches); err != nil {
			return nil, fmt.Errorf("certmanager: register metrics: %w", err)
		}
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m, nil
}

// Close stops every refresh, drops every certificate and waits for the
// fetch goroutines to return. Fetch fails with ErrClosed afterwards. It is
// safe to call more than once.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	for id, e := range m.entries {
		delete(m.entries, id)
		dropLocked(e)
	}
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
	return nil
}

// Track starts prefetching and refreshing id's certificate, if it is not
// tracked yet.
func (m *Manager) Track(id identity.Identity) {
	if id.IsZero() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed && m.entries[id] == nil {
		m.startLocked(id)
	}
}

// Forget stops refreshing id and drops its certificate. Fetches waiting for
// it fail with ErrForgotten. A later Fetch or Track starts over.
func (m *Manager) Forget(id identity.Identity) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil {
		delete(m.entries, id)
		dropLocked(e)
	}
}

// SetWanted makes ids the tracked set: identities not yet tracked start
// prefetching, tracked ones not in ids are forgotten. The node proxy calls it
// whenever the set of HBONE workloads on its node changes.
func (m *Manager) SetWanted(ids []identity.Identity) {
	want := make(map[identity.Identity]struct{}, len(ids))
	for _, id := range ids {
		if !id.IsZero() {
			want[id] = struct{}{}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	for id, e := range m.entries {
		if _, ok := want[id]; !ok {
			delete(m.entries, id)
			dropLocked(e)
		}
	}
	for id := range want {
		if m.entries[id] == nil {
			m.startLocked(id)
		}
	}
}

// Fetch implements identity.CertSource. It returns the cached certificate
// while it is valid (refreshes happen in the background). Otherwise it waits,
// bounded by ctx, for the identity's fetch in progress; if none is in
// progress because the last attempt failed, it fails at once with
// ErrUnavailable and the CA error rather than waiting out the backoff. An
// identity that is not tracked is tracked from now on, until Forget or a
// SetWanted without it.
func (m *Manager) Fetch(ctx context.Context, id identity.Identity) (*identity.WorkloadCertificate, error) {
	if id.IsZero() {
		return nil, errors.New("certmanager: fetch for the empty identity")
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("certmanager: fetch %s: %w", id, ErrClosed)
	}
	e := m.entries[id]
	if e == nil {
		e = m.startLocked(id)
	}
	for {
		if e.dropped {
			reason := ErrForgotten
			if m.closed {
				reason = ErrClosed
			}
			m.mu.Unlock()
			return nil, fmt.Errorf("certmanager: fetch %s: %w", id, reason)
		}
		now := m.clock.Now()
		if e.cert != nil && now.Before(e.cert.NotAfter()) {
			c := e.cert
			m.mu.Unlock()
			return c, nil
		}
		if !e.fetching {
			err := unavailableError(e, now)
			m.mu.Unlock()
			return nil, err
		}
		wait := e.attempted
		m.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("certmanager: waiting for the certificate of %s: %w", id, ctx.Err())
		}
		m.mu.Lock()
	}
}

// unavailableError explains why e has no usable certificate. Called with mu held.
func unavailableError(e *entry, now time.Time) error {
	retry := e.nextAttempt.Sub(now).Round(time.Millisecond)
	if e.cert != nil {
		return fmt.Errorf("certmanager: %s: %w: certificate expired at %s, renewal failed %d times, retrying in %v: %w",
			e.id, ErrUnavailable, e.cert.NotAfter().UTC().Format(time.RFC3339), e.failures, retry, e.lastErr)
	}
	return fmt.Errorf("certmanager: %s: %w: fetch failed %d times, retrying in %v: %w",
		e.id, ErrUnavailable, e.failures, retry, e.lastErr)
}

// startLocked creates id's entry and its goroutine. Called with mu held.
func (m *Manager) startLocked(id identity.Identity) *entry {
	ctx, cancel := context.WithCancel(m.ctx)
	e := &entry{id: id, cancel: cancel, fetching: true, attempted: make(chan struct{})}
	m.entries[id] = e
	m.wg.Add(1)
	go m.run(ctx, e)
	return e
}

// dropLocked stops e and wakes its waiters. Called with mu held, after e was
// removed from the map.
func dropLocked(e *entry) {
	e.dropped = true
	e.cancel()
	if e.fetching {
		e.fetching = false
		close(e.attempted)
	}
}

// run fetches e's certificate, then refreshes it at half-life or retries
// with backoff, until e is dropped.
func (m *Manager) run(ctx context.Context, e *entry) {
	defer m.wg.Done()
	for {
		cert, err := m.attempt(ctx, e.id)
		now := m.clock.Now()

		m.mu.Lock()
		if e.dropped {
			m.mu.Unlock()
			return
		}
		prev, prevFailures := e.cert, e.failures
		var wait time.Duration
		if err == nil {
			e.cert, e.lastErr, e.failures = cert, nil, 0
			wait = max(cert.RefreshAt().Sub(now), m.cfg.InitialBackoff)
		} else {
			e.lastErr = err
			e.failures++
			wait = backoffDelay(e.failures, m.cfg.InitialBackoff, m.cfg.MaxBackoff, rand.Float64())
		}
		failures := e.failures
		e.nextAttempt = now.Add(wait)
		e.fetching = false
		close(e.attempted)
		m.mu.Unlock()

		m.report(e.id, cert, err, prev, prevFailures, failures, now, wait)

		t := m.clock.NewTimer(wait)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return
		}

		m.mu.Lock()
		if e.dropped {
			m.mu.Unlock()
			return
		}
		e.fetching = true
		e.attempted = make(chan struct{})
		e.nextAttempt = time.Time{}
		m.mu.Unlock()
	}
}

// attempt makes one CA request for id with a fresh key, taking a slot of
// the concurrency limit for its duration.
func (m *Manager) attempt(ctx context.Context, id identity.Identity) (*identity.WorkloadCertificate, error) {
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-m.sem }()
	key, err := identity.GenerateKey()
	if err != nil {
		return nil, fmt.Errorf("certmanager: key for %s: %w", id, err)
	}
	csr, err := identity.NewCSR(id, key)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
	defer cancel()
	chain, err := m.req.Request(rctx, id, csr)
	if err != nil {
		return nil, err // the Requester's error says which CA and why; callers add the identity
	}
	wc, err := identity.FromChain(id, key, chain)
	if err != nil {
		return nil, fmt.Errorf("certmanager: bad CA answer: %w", err)
	}
	if now := m.clock.Now(); !now.Before(wc.NotAfter()) {
		return nil, fmt.Errorf("certmanager: bad CA answer: certificate expired at %s (clock skew?)",
			wc.NotAfter().UTC().Format(time.RFC3339))
	}
	return wc, nil
}

// report logs and counts one attempt's outcome: a warning on the first
// failure of a streak, debug for the rest; info for a first certificate or a
// recovery, debug for routine refreshes.
func (m *Manager) report(id identity.Identity, cert *identity.WorkloadCertificate, err error,
	prev *identity.WorkloadCertificate, prevFailures, failures int, now time.Time, wait time.Duration) {
	if err != nil {
		m.fetches.WithLabelValues("failure").Inc()
		fields := []zap.Field{
			zap.String("identity", id.String()), zap.Error(err), zap.Int("failures", failures),
			zap.Duration("retry_in", wait),
			zap.Bool("serving_previous", prev != nil && now.Before(prev.NotAfter())),
		}
		if failures == 1 {
			m.log.Warn("certificate fetch failed", fields...)
		} else {
			m.log.Debug("certificate fetch failed again", fields...)
		}
		return
	}
	m.fetches.WithLabelValues("success").Inc()
	fields := []zap.Field{
		zap.String("identity", id.String()), zap.Time("expires", cert.NotAfter()),
		zap.Time("refresh_at", now.Add(wait)),
	}
	switch {
	case prevFailures > 0:
		m.log.Info("certificate fetch recovered", append(fields, zap.Int("after_failures", prevFailures))...)
	case prev == nil:
		m.log.Info("certificate fetched", fields...)
	default:
		m.log.Debug("certificate refreshed", fields...)
	}
}
