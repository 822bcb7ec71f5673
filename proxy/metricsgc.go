package proxy

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// workloadKey is how a series names a workload: its source_workload /
// destination_workload value and namespace (peerOf).
type workloadKey struct{ name, namespace string }

// DropDeletedWorkloads bounds the istio_tcp_* label cardinality (as Istio's
// ztunnel does since ztunnel#1942): once a workload has been gone from the
// mesh state for grace, every series naming it as source or destination is
// deleted, so a cluster that churns pods does not grow the scrape forever.
// The grace leaves time for the last values to be scraped. Only workloads
// the state once held are dropped (a peer known only from baggage, in
// another cluster, is never touched), never while one of this process's
// open connections still reports under that workload, and a workload that
// comes back within the grace keeps its series. grace <= 0 disables it.
// It runs until ctx is done; the state is read at most every tick.
func (m *Metrics) DropDeletedWorkloads(ctx context.Context, store *state.Store, grace time.Duration, log *zap.Logger) {
	if grace <= 0 {
		return
	}
	if log == nil {
		log = zap.NewNop()
	}
	tick := min(max(grace/4, 100*time.Millisecond), 30*time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	g := metricsGC{grace: grace, gone: map[workloadKey]time.Time{}}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			g.noteNamed(m.takeNamed())
			for _, k := range g.step(store.Load(), now, m.liveWorkloads()) {
				n := m.dropWorkload(k)
				log.Info("dropped the metrics of a deleted workload",
					zap.String("workload", k.name), zap.String("namespace", k.namespace), zap.Int("series", n))
			}
		}
	}
}

// metricsGC is DropDeletedWorkloads' bookkeeping, separate from the clock
// and the registry so it can be tested step by step.
type metricsGC struct {
	grace   time.Duration
	gen     uint64
	started bool
	present map[workloadKey]struct{}
	// gone: workloads the state held once and holds no more, since when.
	gone map[workloadKey]time.Time
	// named: workloads of the state that series were labelled with and
	// that no read of the state has seen yet (a pod can live and die
	// between two reads), until they are dropped.
	named map[workloadKey]struct{}
}

// noteNamed adds the workloads series were labelled with (Metrics.takeNamed).
func (g *metricsGC) noteNamed(ks map[workloadKey]struct{}) {
	if len(ks) == 0 {
		return
	}
	if g.named == nil {
		g.named = make(map[workloadKey]struct{}, len(ks))
	}
	for k := range ks {
		g.named[k] = struct{}{}
	}
}

// step reads snap (when it is a new generation) and returns the workloads
// whose series are due to be dropped now; live are those open connections
// report under, which wait.
func (g *metricsGC) step(snap *state.Snapshot, now time.Time, live map[workloadKey]struct{}) []workloadKey {
	if !g.started || snap.Generation != g.gen {
		next := make(map[workloadKey]struct{}, snap.NumWorkloads())
		for w := range snap.Workloads() {
			next[keyOf(w)] = struct{}{}
		}
		for k := range g.present {
			if _, ok := next[k]; !ok {
				g.gone[k] = now
			}
		}
		for k := range next {
			delete(g.gone, k)
		}
		g.present, g.gen, g.started = next, snap.Generation, true
	}
	for k := range g.named {
		if _, ok := g.present[k]; ok {
			// Seen in the state: the diff of reads catches its leaving.
			delete(g.named, k)
			continue
		}
		if _, ok := g.gone[k]; !ok {
			g.gone[k] = now // absent at this read: gone since then at the latest
		}
	}
	var due []workloadKey
	for k, since := range g.gone {
		if now.Sub(since) < g.grace {
			continue
		}
		if _, ok := live[k]; ok {
			continue
		}
		due = append(due, k)
		delete(g.gone, k)
		delete(g.named, k)
	}
	return due
}

func keyOf(w *state.Workload) workloadKey {
	p := peerOf(w)
	return workloadKey{p.Workload, p.Namespace}
}

// liveWorkloads are the source and destination workloads of the open
// connections the flusher reports.
func (m *Metrics) liveWorkloads() map[workloadKey]struct{} {
	m.live.mu.Lock()
	defer m.live.mu.Unlock()
	out := make(map[workloadKey]struct{}, 2*m.live.conns.len())
	for r := range m.live.conns.all() {
		out[workloadKey{r.Src.Workload, r.Src.Namespace}] = struct{}{}
		out[workloadKey{r.Dst.Workload, r.Dst.Namespace}] = struct{}{}
	}
	return out
}

// dropWorkload deletes every istio_tcp_* series naming k as source or
// destination and returns how many.
func (m *Metrics) dropWorkload(k workloadKey) int {
	n := 0
	for _, side := range []prometheus.Labels{
		{"source_workload": k.name, "source_workload_namespace": k.namespace},
		{"destination_workload": k.name, "destination_workload_namespace": k.namespace},
	} {
		for _, v := range []*prometheus.CounterVec{m.opened, m.closed, m.sent, m.received, m.failed} {
			n += v.DeletePartialMatch(side)
		}
	}
	return n
}
