package daemon

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"time"
)

// ReleaseMemory returns the heap a burst freed to the operating system
// instead of letting the process keep it: every interval it reads how much
// of the heap is reclaimable (free and still resident, plus objects that
// were not live at the last collection: the garbage a burst left, which no
// collection has freed yet) and how far the live heap of the last
// collection has grown since its last release, and when either is at least
// threshold it calls debug.FreeOSMemory after one more collection (two
// collections, then every free page returned). It runs until ctx is done.
//
// Why: after 10,000 connections close, a node proxy's Go heap and the
// goroutine stacks they used are garbage or free, but the runtime keeps
// them resident: its background scavenger returns memory only down to a
// target derived from the heap goal of the last collection, and a proxy
// gone quiet collects only every two minutes, so the burst's size stays
// (bench/soak measured 50-90 MiB "idle not released" per proxy after each
// wave, VmRSS 5-6 times its baseline). The check costs one runtime/metrics
// read; the release two collections of the live heap, at most once per
// interval.
//
// The tick checks only after an interval without a collection: a process
// that collects by itself is busy, its garbage between collections is
// always over threshold, and a release then only made the heap grow back
// (the page faults of regrowing it, two extra collections; in an execution
// trace of a node proxy at 1k req/s on two Ps, the release's collections
// spun 19,000 times through runtime.Gosched in 2 s). Once it goes quiet, the
// next tick releases.
//
// The growth of the live heap is the second trigger because what a
// sync.Pool holds counts as live once a collection has run since it was
// put there (it sits in the pool's victim cache): after a bulk transfer,
// hbone's pooled receive chunks (bench-mesh: 18 MiB on the receiving
// proxy) looked live, not reclaimable, and stayed until two more
// collections, which a quiet proxy does not run for two minutes. A live
// heap that really grew (more workloads) costs one release, which then
// sets the new floor.
//
// load, when set, is what the process has open and has started (a node
// proxy's connections). Two ends of activity then release at once,
// checked every loadPoll, rather than at whatever point of the next
// interval the tick falls:
//   - a burst's end: Open has fallen to a quarter of its peak since the
//     last release (a peak of at least burstMin) and stopped falling.
//     Closing a bench/soak wave of 10,000 tunnels makes garbage of its own
//     (VmRSS right after the close above the held peak); with the burst's
//     end as the trigger it is back within half a second.
//   - a run's end: at least burstMin started since the last release, one
//     after another or a few at a time (no peak), and none for two polls.
//     bench/mesh's connect part opens 1,000 connections one at a time; its
//     garbage was still resident when the run read mesh_proxy_rss_mb
//     within 5 s of the last one (9.5 MiB of Go arena against 6.4 MiB
//     once the tick had released).
//
// An end counts as handled once a release ran: when it is seen before
// its garbage is (a collection ran in the middle of the closes and the
// rest are still closing), the next polls look again.
//
// A release can also come while a burst is still in use: at its peak (a
// run's end is seen once the openings stop) or in the middle of its
// closes (a tick, or connections still ending after the count fell). Its
// collection marks them live, and the floor it sets is that much above
// the live heap at rest. Once they are done, nothing a quiet process
// reads shows their memory as garbage until a collection runs, which a
// quiet proxy does not run for two minutes (bench/soak, 12-07: 29-37 MiB
// kept through a whole gap between two waves). So after a release that
// left the floor at least threshold above the rest level, the polls look
// once more, with a collection of their own first, when the load has
// stayed still for settlePolls below what was open at the release, or at
// none. A look that finds part of the burst ended while some of it is
// still open looks again once the load settles lower still: a burst that
// closes in steps keeps its last part in use at the first.
func ReleaseMemory(ctx context.Context, interval time.Duration, threshold uint64, load Load) {
	r := newReleaser(threshold)
	t := time.NewTicker(interval)
	defer t.Stop()
	var poll <-chan time.Time
	if load.Open != nil {
		p := time.NewTicker(loadPoll)
		defer p.Stop()
		poll = p.C
	}
	var a activity
	a.reset(load)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !r.quiet() {
				break
			}
			if load.Open != nil {
				a.last = load.Open()
			}
			if r.check() {
				a.released(load, r)
			}
		case <-poll:
			switch {
			case a.ended(load) && r.check(): // ended reads the load into a.last
				a.released(load, r)
			case a.followUp && a.settled(load):
				a.followedUp(load, r, r.collectAndCheck())
			}
		}
	}
}

// Load is what a process has open and has started so far, for
// ReleaseMemory; the zero Load has neither.
type Load struct {
	Open func() int64
	// Started counts up; nil: no run trigger.
	Started func() int64
}

// activity is ReleaseMemory's view of Load between polls.
type activity struct {
	peak, last int64 // Open's peak since the last release, and at the last poll or tick
	// runStart is Started at the last release; seen at the last poll;
	// still the polls in a row that saw no start.
	runStart, seen int64
	still          int
	flat           int // polls in a row that saw Open unchanged
	// followUp: the last release left the floor well above the rest
	// level, with openAt open.
	followUp bool
	openAt   int64
}

// released starts over after a release, and notes whether it needs a
// follow-up. a.last is what was open when the release began: connections
// that close during its collections are ones it held.
func (a *activity) released(load Load, r *releaser) {
	a.reset(load)
	a.followUp = load.Open != nil && r.floor >= r.rest+r.threshold
	a.openAt = a.last
}

// followedUp notes a look again, which found ended memory or not. One
// that found some while connections are still open looks again once the
// load settles lower: a burst that closes in steps has its last ones
// still in use at the first. Otherwise what is still live is the rest
// level.
func (a *activity) followedUp(load Load, r *releaser, found bool) {
	if found {
		a.reset(load)
	}
	a.followUp = found && a.last > 0 && r.floor >= r.rest+r.threshold
	a.openAt = a.last
	if !a.followUp {
		r.rest = r.floor
	}
}

// reset starts over after a release.
func (a *activity) reset(load Load) {
	if load.Open != nil {
		a.peak = load.Open()
	}
	if load.Started != nil {
		a.runStart = load.Started()
	}
}

// ended reads load and reports whether a burst or a run has ended since
// the last release.
func (a *activity) ended(load Load) bool {
	n := load.Open()
	a.peak = max(a.peak, n)
	burst := a.peak >= burstMin && n <= a.peak/4 && n >= a.last
	if n == a.last {
		a.flat++
	} else {
		a.flat = 0
	}
	a.last = n
	if load.Started == nil {
		return burst
	}
	s := load.Started()
	if s == a.seen {
		a.still++
	} else {
		a.still = 0
	}
	a.seen = s
	return burst || s-a.runStart >= burstMin && a.still >= 2
}

// settled reports whether the last settlePolls polls of ended saw no
// change (nothing opened, closed or started) at fewer open than at the
// last release, or at none: a load that holds where it was released holds
// what it had.
func (a *activity) settled(load Load) bool {
	return a.flat >= settlePolls && (load.Started == nil || a.still >= settlePolls) &&
		(a.last < a.openAt || a.last == 0)
}

// A burst is at least burstMin open at once, a run at least burstMin
// started; an end is noticed within loadPoll (two for a run). The load is
// settled after settlePolls polls without a change.
const (
	burstMin    = 64
	loadPoll    = 250 * time.Millisecond
	settlePolls = 4
)

// HeapProfileOff turns the heap profile's sampling off unless godebug (the
// process's GODEBUG) sets memprofilerate, Go's own switch for it, which
// the runtime has applied before main. Call it first thing in main.
//
// Why: the runtime keeps a record (a bucket) of every allocation stack it
// ever sampled, one in 512 KiB by default, and never frees one; the hash
// table they hang from (1.4 MiB) becomes resident a page at a time as new
// stacks land in it. In bench/soak the node proxy's memory at rest then
// grew by 350 KiB over ten waves of 10,000 tunnels, heap and stacks equal
// (soak_rss_slope_kb_per_min 153-183 KiB/min); with the sampling off it
// stayed within 70 KiB (67-74 KiB/min) and sat ~1 MiB lower. Istio's
// ztunnel and Envoy profile their heap only when asked, too.
// /debug/pprof/heap says so while it is off (DebugHandlers).
func HeapProfileOff(godebug string) {
	if !GodebugSets(godebug, "memprofilerate") {
		runtime.MemProfileRate = 0
	}
}

// GodebugSets reports whether the GODEBUG value godebug sets key.
func GodebugSets(godebug, key string) bool {
	for kv := range strings.SplitSeq(godebug, ",") {
		if k, _, _ := strings.Cut(strings.TrimSpace(kv), "="); k == key {
			return true
		}
	}
	return false
}

// releaser is ReleaseMemory's state between checks.
type releaser struct {
	threshold uint64
	samples   []metrics.Sample
	floor     uint64 // the live heap right after the last release
	// rest is the lowest floor, or the live heap a follow-up found: the
	// heap with no burst in it.
	rest uint64
	// cycles is the count of completed collections at the last tick or
	// release, for quiet.
	cycles uint64
	gc     []metrics.Sample
}

func newReleaser(threshold uint64) *releaser {
	r := &releaser{threshold: threshold,
		samples: []metrics.Sample{{Name: freeHeapMetric}, {Name: heapObjectsMetric}, {Name: liveHeapMetric}},
		gc:      []metrics.Sample{{Name: gcCyclesMetric}}}
	r.cycles = r.gcCycles()
	return r
}

// quiet reports whether no collection completed since the last call or
// release.
func (r *releaser) quiet() bool {
	n := r.gcCycles()
	q := n == r.cycles
	r.cycles = n
	return q
}

func (r *releaser) gcCycles() uint64 {
	metrics.Read(r.gc)
	if r.gc[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return r.gc[0].Value.Uint64()
}

// check releases memory when enough is reclaimable or the live heap grew
// by threshold since the last release, and reports whether it did.
func (r *releaser) check() bool {
	reclaim, live := reclaimable(r.samples)
	if reclaim < r.threshold && live < r.floor+r.threshold {
		return false
	}
	// Two collections: what a sync.Pool holds survives the first (it
	// moves to the pool's victim cache, counted live), and a burst leaves
	// its buffers there (hbone's receive chunks, gRPC's receive buffers).
	runtime.GC()
	debug.FreeOSMemory()
	_, r.floor = reclaimable(r.samples)
	if r.rest == 0 || r.floor < r.rest {
		r.rest = r.floor
	}
	r.cycles = r.gcCycles() // its own collections do not make the process busy
	return true
}

// collectAndCheck is check after a collection, which turns memory that
// stopped being used since the last one into garbage check can count.
// The live heap it leaves is the new floor, released or not. It reports
// whether that floor is at least threshold under the one before: memory
// in use at the last release was found ended. Not whether check
// released: objects that shared their spans with ones still in use
// become free slots in those spans, which check does not count and
// FreeOSMemory cannot return (TestReleaseMemoryFollowsUpAPartialClose,
// where the two halves of a burst were allocated in turn).
func (r *releaser) collectAndCheck() (found bool) {
	prev := r.floor
	runtime.GC()
	r.cycles = r.gcCycles() // its own collection does not make the process busy
	if !r.check() {
		_, r.floor = reclaimable(r.samples)
	}
	return r.floor+r.threshold <= prev
}

// reclaimable reads samples and returns free resident heap plus the heap
// objects beyond the last collection's live heap, and that live heap.
func reclaimable(samples []metrics.Sample) (reclaim, live uint64) {
	metrics.Read(samples)
	var v [3]uint64
	for i, s := range samples {
		if s.Value.Kind() != metrics.KindUint64 {
			return 0, 0
		}
		v[i] = s.Value.Uint64()
	}
	free, objects, live := v[0], v[1], v[2]
	if objects > live {
		free += objects - live
	}
	return free, live
}

// The runtime/metrics read: heap memory that is free and still backed by
// physical memory; heap objects, live or not yet collected; the heap
// marked live by the last collection.
const (
	freeHeapMetric    = "/memory/classes/heap/free:bytes"
	heapObjectsMetric = "/memory/classes/heap/objects:bytes"
	liveHeapMetric    = "/gc/heap/live:bytes"
	gcCyclesMetric    = "/gc/cycles/total:gc-cycles"
)
