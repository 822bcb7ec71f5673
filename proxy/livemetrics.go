package proxy

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultFlushInterval is how often the byte counters of open connections
// are brought up to date (Istio's ztunnel reports bytes while a connection
// runs; a long-lived connection must not be invisible until it ends).
const DefaultFlushInterval = time.Second

// MetricsOption changes NewMetrics' defaults.
type MetricsOption func(*Metrics)

// FlushEvery sets how often open connections' byte counts are flushed into
// the counters (DefaultFlushInterval when d <= 0).
func FlushEvery(d time.Duration) MetricsOption {
	return func(m *Metrics) {
		if d > 0 {
			m.flushEvery = d
		}
	}
}

// liveSet holds the opened, not yet recorded connections whose bytes the
// flusher reports. Invariants: a Result is in conns exactly between
// Result.Opened and Result.Record; the flusher goroutine runs while conns is
// non-empty (running says so) and exits, under mu, when it finds it empty;
// each Result's flushed counts only grow, under that Result's fmu, so the
// flusher and Record never add the same bytes twice.
//
// conns gives its memory back after a burst (shrinkSet).
type liveSet struct {
	mu      sync.Mutex
	conns   shrinkSet[*Result]
	running bool
	// named are the state's workloads series were labelled with since
	// DropDeletedWorkloads last took them: a workload that lives between
	// two of its reads of the state still has its series dropped.
	named map[workloadKey]struct{}
}

// openCounters are the counters a connection's bytes go to: those of the
// labels it was opened with (response_flags "-"), as Istio does.
type openCounters struct {
	received, sent prometheus.Counter
}

func (m *Metrics) addLive(r *Result) {
	m.live.mu.Lock()
	m.noteNamedLocked(r)
	m.live.conns.add(r)
	start := !m.live.running
	m.live.running = true
	m.live.mu.Unlock()
	if start {
		go m.flushLoop()
	}
}

// noteNamed records r's peers that came from the state (see liveSet.named)
// for a connection that never opened.
func (m *Metrics) noteNamed(r *Result) {
	if !r.Src.fromState && !r.Dst.fromState {
		return
	}
	m.live.mu.Lock()
	m.noteNamedLocked(r)
	m.live.mu.Unlock()
}

// noteNamedLocked is noteNamed under m.live.mu (addLive holds it anyway):
// a lookup per peer, an insert only for a workload new since the last take.
func (m *Metrics) noteNamedLocked(r *Result) {
	for _, p := range [2]*Peer{&r.Src, &r.Dst} {
		if !p.fromState || p.Workload == "" {
			continue
		}
		k := workloadKey{p.Workload, p.Namespace}
		if _, ok := m.live.named[k]; ok {
			continue
		}
		if m.live.named == nil {
			m.live.named = map[workloadKey]struct{}{}
		}
		m.live.named[k] = struct{}{}
	}
}

// takeNamed returns the workloads noted since the last call.
func (m *Metrics) takeNamed() map[workloadKey]struct{} {
	m.live.mu.Lock()
	defer m.live.mu.Unlock()
	n := m.live.named
	m.live.named = nil
	return n
}

func (m *Metrics) removeLive(r *Result) {
	m.live.mu.Lock()
	m.live.conns.remove(r)
	m.live.mu.Unlock()
}

// flushLoop flushes every open connection each interval until none is
// open. The set is copied under the lock and flushed outside it.
func (m *Metrics) flushLoop() {
	t := time.NewTicker(m.flushEvery)
	defer t.Stop()
	var batch []*Result
	for range t.C {
		m.live.mu.Lock()
		if m.live.conns.len() == 0 {
			m.live.running = false
			m.live.mu.Unlock()
			return
		}
		batch = batch[:0]
		for r := range m.live.conns.all() {
			batch = append(batch, r)
		}
		m.live.mu.Unlock()
		for _, r := range batch {
			r.flush(false)
		}
		clear(batch)
	}
}

// flush adds the bytes moved since the last flush to the open counters:
// the live estimate while running, the final counts when final.
func (r *Result) flush(final bool) {
	var sent, recv int64
	if final {
		sent, recv = r.Counters.Sent.Load(), r.Counters.Received.Load()
	} else {
		sent, recv = r.Counters.Live()
	}
	r.fmu.Lock()
	defer r.fmu.Unlock()
	if d := sent - r.flushedSent; d > 0 {
		r.flushedSent = sent
		r.oc.received.Add(float64(d)) // client → server: istio_tcp_received_bytes_total
	}
	if d := recv - r.flushedRecv; d > 0 {
		r.flushedRecv = recv
		r.oc.sent.Add(float64(d))
	}
}
