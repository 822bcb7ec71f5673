// Package inpod is the node proxy's workload manager: it implements the ZDS
// Handler (cni/zds) and keeps one running proxy per captured pod, inside that
// pod's network namespace (docs/protocol.md#zds). Add starts a pod's
// proxy (idempotent for the same netns, replace-with-drain for a new one);
// a proxy that fails to start is refused (NACK) and retried every
// RetryInterval from a pending queue; Del drains only that pod's listeners;
// SnapshotSent drops every pod the agent no longer mentions. Ready gates
// readiness on "first snapshot received and nothing pending".
//
// It is not the data path: what a pod's proxy is (listeners, DNS server)
// comes from a Factory (ProxyFactory in production, a fake in tests). It
// does not talk to the agent either; zds.Client does and calls in here.
package inpod

// Manager invariants:
//
//   - opMu serializes every mutation (ZDS messages, pending retries,
//     Shutdown) and is held across Factory calls, so two starts for one uid
//     never race. mu guards the maps only briefly, for readers (Dump,
//     metrics); it is never held across Factory, Drain or Close calls.
//   - A uid is in at most one of running and pending.
//   - The manager owns every netns.Handle it keeps (running or pending) and
//     closes it after the proxy using it is closed, or when the entry is
//     dropped.
//   - Draining happens off the ZDS goroutine (the agent waits at most 5 s for
//     an ack); every drain goroutine is counted in drains, which Shutdown
//     waits for.
//   - ready is closed at most once, the first time the first snapshot has
//     been received and nothing is pending (a one-shot gate, as Istio's
//     ztunnel: a pod failing later does not make the node proxy unready).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/cni/zds"
	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod/inpodstate"
)

// DefaultRetryInterval is how often pending proxies are retried (Istio's
// ztunnel: 5 s).
const DefaultRetryInterval = 5 * time.Second

// DefaultDrainDeadline is used when Config.DrainDeadline is 0.
const DefaultDrainDeadline = 5 * time.Second

// ErrClosed is returned by Add after Shutdown.
var ErrClosed = errors.New("inpod: workload manager shut down")

// Workload is the pod a proxy serves, as ZDS names it (inpodstate.Workload,
// shared with the config dump's readers).
type Workload = inpodstate.Workload

// Proxy is one pod's running proxy (its listeners, and its DNS server if
// enabled).
type Proxy interface {
	// Serve accepts connections until the proxy is drained or closed, or ctx
	// is done. It is called once, on its own goroutine.
	Serve(ctx context.Context) error
	// Drain stops accepting, lets open connections finish until deadline
	// (or ctx is done), then closes them.
	Drain(ctx context.Context, deadline time.Duration)
	// Close closes listeners and connections at once. Called once, after
	// Drain if there was one.
	Close() error
}

// Factory creates a pod's proxy. The Factory does not own ns: the manager
// keeps it open until the proxy's Close has returned. A Factory that fails
// must release everything it opened.
type Factory interface {
	NewProxy(w Workload, ns *netns.Handle) (Proxy, error)
}

// FactoryFunc adapts a function to Factory.
type FactoryFunc func(w Workload, ns *netns.Handle) (Proxy, error)

// NewProxy implements Factory.
func (f FactoryFunc) NewProxy(w Workload, ns *netns.Handle) (Proxy, error) { return f(w, ns) }

// Config tunes a Manager. The zero value is Istio's behaviour.
type Config struct {
	// DrainDeadline bounds the drain of a removed or replaced pod's proxy and
	// of every proxy at Shutdown (config.Config.DrainDeadline); 0 means
	// DefaultDrainDeadline.
	DrainDeadline time.Duration
	// RetryInterval is the pending-queue retry period; 0 means
	// DefaultRetryInterval.
	RetryInterval time.Duration
}

// Deps are the Manager's collaborators.
type Deps struct {
	// Factory builds pod proxies. Required.
	Factory Factory
	// Log receives start, stop and failure lines; nil means no logs.
	Log *zap.Logger
	// Registerer receives the workload_manager_* metrics; nil means they are
	// kept but not exported.
	Registerer prometheus.Registerer
}

// Manager keeps one proxy per captured pod. It implements zds.Handler.
// Create it with New, run the retry loop with Run, stop it with Shutdown.
type Manager struct {
	cfg     Config
	factory Factory
	log     *zap.Logger
	metrics *metrics

	ctx    context.Context // parent of every proxy's Serve context
	cancel context.CancelFunc
	drains sync.WaitGroup // drain-and-close goroutines
	serves sync.WaitGroup // Serve goroutines

	opMu sync.Mutex // serializes mutations; see invariants

	mu               sync.Mutex
	running          map[string]*entry
	pending          map[string]*entry
	draining         map[*entry]struct{}
	snapshotReceived bool
	closed           bool
	ready            chan struct{}
	readyClosed      bool
}

var _ zds.Handler = (*Manager)(nil)

// entry is one pod: running (proxy != nil) or pending (proxy == nil).
type entry struct {
	w       Workload
	ns      *netns.Handle
	proxy   Proxy
	cancel  context.CancelFunc // cancels Serve's context; nil while pending
	lastErr error              // last start failure (pending only)
	since   time.Time          // started, or first failure
}

// New returns a Manager with no proxies.
func New(cfg Config, deps Deps) (*Manager, error) {
	if deps.Factory == nil {
		return nil, errors.New("inpod: Deps.Factory is required")
	}
	if cfg.DrainDeadline <= 0 {
		cfg.DrainDeadline = DefaultDrainDeadline
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	log := deps.Log
	if log == nil {
		log = zap.NewNop()
	}
	met, err := newMetrics(deps.Registerer)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{
		cfg: cfg, factory: deps.Factory, log: log, metrics: met,
		ctx: ctx, cancel: cancel,
		running:  map[string]*entry{},
		pending:  map[string]*entry{},
		draining: map[*entry]struct{}{},
		ready:    make(chan struct{}),
	}, nil
}

// Ready is closed once the first ZDS snapshot has been received (so the
// agent is connected) and no proxy is pending. It stays closed.
func (m *Manager) Ready() <-chan struct{} { return m.ready }

// Run retries pending proxies every RetryInterval until ctx is done.
func (m *Manager) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.RetryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			m.retryPending()
		}
	}
}

// Add implements zds.Handler: start the proxy of pod uid in ns, or confirm
// it when it already runs in the same namespace.
func (m *Manager) Add(uid string, info *zdsapi.WorkloadInfo, ns *netns.Handle) error {
	m.opMu.Lock()
	defer m.opMu.Unlock()
	w := Workload{UID: uid, Name: info.GetName(), Namespace: info.GetNamespace(), ServiceAccount: info.GetServiceAccount()}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		ns.Close()
		return ErrClosed
	}
	old := m.running[uid]
	if old != nil && old.ns.ID() == ns.ID() {
		m.mu.Unlock()
		ns.Close()
		m.log.Debug("pod already proxied in this network namespace", zap.String("uid", uid), zap.Stringer("netns", ns))
		return nil
	}
	if old != nil {
		delete(m.running, uid)
	}
	stale := m.pending[uid]
	delete(m.pending, uid)
	m.mu.Unlock()

	if old != nil {
		m.log.Info("pod's network namespace changed; draining the old proxy",
			zap.String("uid", uid), zap.Stringer("old_netns", old.ns), zap.Stringer("new_netns", ns))
		m.drainInBackground(old)
	}
	if stale != nil {
		stale.ns.Close()
	}
	e := &entry{w: w, ns: ns}
	err := m.start(e)
	m.updateGauges()
	return err
}

// start starts e's proxy and files e as running, or as pending on failure
// (returning the failure). Called with opMu held.
func (m *Manager) start(e *entry) error {
	p, err := m.factory.NewProxy(e.w, e.ns)
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if e.lastErr == nil {
			e.since = now
		}
		e.lastErr = err
		m.pending[e.w.UID] = e
		m.log.Warn("pod proxy failed to start; will retry", zap.String("uid", e.w.UID),
			zap.String("pod", e.w.Namespace+"/"+e.w.Name), zap.Duration("retry", m.cfg.RetryInterval), zap.Error(err))
		return fmt.Errorf("inpod: start proxy for pod %s (%s/%s): %w", e.w.UID, e.w.Namespace, e.w.Name, err)
	}
	ctx, cancel := context.WithCancel(m.ctx)
	e.proxy, e.cancel, e.lastErr, e.since = p, cancel, nil, now
	m.running[e.w.UID] = e
	m.metrics.started.Inc()
	m.serves.Add(1)
	go func() {
		defer m.serves.Done()
		if err := p.Serve(ctx); err != nil && ctx.Err() == nil {
			m.log.Error("pod proxy stopped serving", zap.String("uid", e.w.UID), zap.Error(err))
		}
	}()
	m.log.Info("pod proxy started", zap.String("uid", e.w.UID), zap.String("pod", e.w.Namespace+"/"+e.w.Name),
		zap.Stringer("netns", e.ns))
	return nil
}

// Keep implements zds.Handler. The agent no longer knows the pod's netns;
// whatever runs (or is pending) for uid stays. An unknown uid is not an
// error: there is simply nothing to keep.
func (m *Manager) Keep(uid string) error {
	m.mu.Lock()
	_, r := m.running[uid]
	_, p := m.pending[uid]
	m.mu.Unlock()
	if !r && !p {
		m.log.Info("agent asked to keep a pod this proxy does not know", zap.String("uid", uid))
	}
	return nil
}

// Del implements zds.Handler: drain and close only that pod's proxy (in the
// background, bounded by DrainDeadline), or drop it from the pending queue.
// Deleting an unknown uid is not an error (deletes are broadcast to every
// node proxy during an upgrade).
func (m *Manager) Del(uid string) error {
	m.opMu.Lock()
	defer m.opMu.Unlock()
	m.remove(func(u string) bool { return u == uid }, "pod deleted")
	return nil
}

// SnapshotSent implements zds.Handler: every pod not in seen is stopped
// (running) or forgotten (pending).
func (m *Manager) SnapshotSent(seen []string) error {
	m.opMu.Lock()
	defer m.opMu.Unlock()
	n := m.remove(func(u string) bool { _, ok := slices.BinarySearch(seen, u); return !ok }, "pod not in the agent's snapshot")
	m.mu.Lock()
	m.snapshotReceived = true
	m.mu.Unlock()
	m.log.Info("agent snapshot received", zap.Int("pods", len(seen)), zap.Int("removed", n))
	m.updateGauges()
	return nil
}

// remove drops every running or pending pod whose uid matches; running ones
// drain in the background. It returns how many were dropped. Called with
// opMu held.
func (m *Manager) remove(match func(uid string) bool, why string) int {
	var drop, forget []*entry
	m.mu.Lock()
	for uid, e := range m.running {
		if match(uid) {
			drop = append(drop, e)
			delete(m.running, uid)
		}
	}
	for uid, e := range m.pending {
		if match(uid) {
			forget = append(forget, e)
			delete(m.pending, uid)
		}
	}
	m.mu.Unlock()
	for _, e := range drop {
		m.log.Info("draining pod proxy", zap.String("uid", e.w.UID), zap.String("reason", why))
		m.drainInBackground(e)
	}
	for _, e := range forget {
		m.log.Info("forgetting pending pod", zap.String("uid", e.w.UID), zap.String("reason", why))
		e.ns.Close()
	}
	m.updateGauges()
	return len(drop) + len(forget)
}

// drainInBackground drains and closes a running entry that has already been
// taken out of running.
func (m *Manager) drainInBackground(e *entry) {
	m.mu.Lock()
	m.draining[e] = struct{}{}
	m.mu.Unlock()
	m.drains.Add(1)
	go func() {
		defer m.drains.Done()
		m.stop(e, true)
	}()
}

// stop drains (if drain) and closes one proxy, then releases its netns.
func (m *Manager) stop(e *entry, drain bool) {
	if drain {
		e.proxy.Drain(m.ctx, m.cfg.DrainDeadline)
	}
	if err := e.proxy.Close(); err != nil {
		m.log.Warn("closing pod proxy", zap.String("uid", e.w.UID), zap.Error(err))
	}
	e.cancel()
	e.ns.Close()
	m.mu.Lock()
	delete(m.draining, e)
	m.mu.Unlock()
	m.metrics.stopped.Inc()
	m.log.Info("pod proxy stopped", zap.String("uid", e.w.UID))
}

// retryPending tries to start every pending proxy once.
func (m *Manager) retryPending() {
	m.opMu.Lock()
	defer m.opMu.Unlock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	todo := make([]*entry, 0, len(m.pending))
	for _, e := range m.pending {
		todo = append(todo, e)
	}
	m.mu.Unlock()
	for _, e := range todo {
		m.mu.Lock()
		delete(m.pending, e.w.UID)
		m.mu.Unlock()
		_ = m.start(e) // logged by start; a failure files it as pending again
	}
	m.updateGauges()
}

// Shutdown refuses further Adds, drains every proxy concurrently (bounded by
// DrainDeadline or ctx), closes them and waits for earlier drains too.
func (m *Manager) Shutdown(ctx context.Context) {
	m.opMu.Lock()
	m.mu.Lock()
	m.closed = true
	running := make([]*entry, 0, len(m.running))
	for _, e := range m.running {
		running = append(running, e)
	}
	pending := make([]*entry, 0, len(m.pending))
	for _, e := range m.pending {
		pending = append(pending, e)
	}
	clear(m.running)
	clear(m.pending)
	m.mu.Unlock()
	m.opMu.Unlock()
	for _, e := range pending {
		e.ns.Close()
	}
	var wg sync.WaitGroup
	for _, e := range running {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.proxy.Drain(ctx, m.cfg.DrainDeadline)
			m.stop(e, false)
		}()
	}
	wg.Wait()
	m.drains.Wait()
	m.cancel()
	m.serves.Wait()
	m.updateGauges()
}

// updateGauges publishes the running and pending counts and opens the
// readiness gate when due.
func (m *Manager) updateGauges() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.metrics.active.Set(float64(len(m.running)))
	m.metrics.pending.Set(float64(len(m.pending)))
	if !m.readyClosed && m.snapshotReceived && len(m.pending) == 0 {
		m.readyClosed = true
		close(m.ready)
	}
}
