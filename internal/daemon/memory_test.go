package daemon

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReleaseMemoryReturnsABurst: the heap a burst freed is returned, not
// kept for the next one.
func TestReleaseMemoryReturnsABurst(t *testing.T) {
	const threshold = 4 << 20
	// A burst: 64 MiB in small objects, then garbage.
	makeGarbage(64 << 20)
	// No collection: the burst is garbage the runtime has not freed yet,
	// as in a proxy gone quiet after its connections closed.
	if f := reclaimableNow(); f < threshold {
		t.Skipf("the runtime returned the burst by itself (%d bytes free): nothing to check", f)
	}
	runReleaser(t, 10*time.Millisecond, threshold, Load{})
	waitReleased(t, threshold, time.Minute, "the burst")
}

// TestReleaseMemoryEmptiesPools: buffers a burst left in a sync.Pool are
// released too, though one collection only moves them to the pool's victim
// cache (where they count as live).
func TestReleaseMemoryEmptiesPools(t *testing.T) {
	// No collection but the test's and the release's own: the burst's
	// buffers stay in the pool's primary cache until the release.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	runtime.GC()
	var pool sync.Pool
	for range 32 << 10 {
		pool.Put(new([1 << 10]byte))
	}
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	if h := heap(); h < 32<<20 {
		t.Skipf("heap %d bytes: the pool was emptied already", h)
	}
	runReleaser(t, 10*time.Millisecond, 4<<20, Load{})
	deadline := time.Now().Add(time.Minute)
	for heap() >= 16<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("heap still %d bytes: the pooled burst was kept", heap())
		}
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(&pool)
}

// TestReleaseMemoryEmptiesCollectedPools: buffers a burst left in a
// sync.Pool are released even when a collection ran after the burst, which
// made them count as live (in the pool's victim cache), not reclaimable:
// the live heap grew since the last release.
func TestReleaseMemoryEmptiesCollectedPools(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	const threshold = 4 << 20
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	r := newReleaser(threshold)
	r.check() // the first check of a process sets the floor
	var pool sync.Pool
	for range 32 << 10 {
		pool.Put(new([1 << 10]byte))
	}
	runtime.GC() // the pool's buffers move to its victim cache: live
	reclaim, live := reclaimable(r.samples)
	if live < r.floor+16<<20 { // (the race detector drops a quarter of the Puts)
		t.Skipf("live heap %d bytes after the burst, %d before: the pool was emptied already", live, r.floor)
	}
	if reclaim >= threshold {
		t.Skipf("%d bytes reclaimable: the burst does not look live, nothing to check", reclaim)
	}
	if !r.check() {
		t.Fatalf("no release with the live heap at %d bytes, %d after the last release", live, r.floor)
	}
	if h := heap(); h >= 16<<20 {
		t.Fatalf("heap still %d bytes after the release: the pooled burst was kept", h)
	}
	if r.check() {
		t.Errorf("released again with nothing new to release (floor %d)", r.floor)
	}
	runtime.KeepAlive(&pool)
}

// TestReleaseMemoryAtBurstEnd: with a load, the garbage of a burst is
// released once the load falls to a quarter of its peak, without waiting
// for the interval; while the load holds, nothing is released early.
func TestReleaseMemoryAtBurstEnd(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	const threshold = 4 << 20
	var load atomic.Int64
	load.Store(1000)
	runReleaser(t, time.Hour, threshold, Load{Open: load.Load})
	time.Sleep(2 * loadPoll) // the peak is seen
	makeGarbage(64 << 20)
	time.Sleep(3 * loadPoll)
	if f := reclaimableNow(); f < threshold {
		t.Fatalf("released while the load held (%d bytes reclaimable)", f)
	}
	load.Store(200) // at a quarter of the peak or under: the burst ended
	waitReleased(t, threshold, 10*time.Second, "the burst's end")
}

// TestReleaseMemoryAtBurstEndWaitsForGarbage: a burst's end with nothing
// yet to release is not used up; the garbage that comes after it is
// released at the next polls, not at the next tick (an hour here).
func TestReleaseMemoryAtBurstEndWaitsForGarbage(t *testing.T) {
	const threshold = 4 << 20
	load := releaserAtPeak(t, threshold)
	load.Store(0)
	time.Sleep(3 * loadPoll) // the end is seen, with nothing to release
	// One allocation, so the garbage appears between two polls: 64 MiB in
	// 1 KiB pieces took longer than a poll under -race on a loaded CI
	// machine, a poll released the part made so far, and that release
	// (rightly) closed the burst, leaving the rest to the hourly tick.
	garbage := make([]byte, 64<<20)
	runtime.KeepAlive(garbage)
	waitReleased(t, threshold, 10*time.Second, "the burst's garbage")
}

// TestReleaseMemoryFollowsUpABurstsSurvivors: a burst's end released while
// part of the burst was still in use (connections still ending, bench/soak
// wave 3 on 12-07: 33 MiB kept resident through the whole gap). Once they
// are done, nothing a quiet process reads shows their memory as garbage
// until a collection runs, so the polls look once more, with a collection
// of their own, when the load has stayed still: the memory goes back
// then, not at the next collection the process runs by itself (an hour
// away here, two minutes in a quiet proxy).
func TestReleaseMemoryFollowsUpABurstsSurvivors(t *testing.T) {
	const threshold = 4 << 20
	load := releaserAtPeak(t, threshold)
	// The process's usual floor: one release of a little garbage first.
	makeGarbage(8 << 20)
	load.Store(0)
	waitReleased(t, threshold, 10*time.Second, "the first burst")
	// The next burst: its memory still in use when its end is seen.
	before := forcedCollections()
	load.Store(1000)
	time.Sleep(2 * loadPoll)
	survivors := make([][]byte, 0, 64<<10)
	for range 64 << 10 {
		survivors = append(survivors, make([]byte, 1<<10))
	}
	// Keep the load moving (never settled) until the survivors are let
	// go, so the look once more cannot come before they are garbage.
	stop := make(chan struct{})
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		for i := int64(0); ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(loadPoll / 5):
				load.Store(1 + i%2)
			}
		}
	}()
	if !waitCollections(before + 1) {
		close(stop)
		t.Fatal("no release at the second burst's end")
	}
	runtime.KeepAlive(survivors)
	survivors = nil
	close(stop)
	<-moved
	load.Store(0)
	waitLiveBelow(t, 32<<20, "the survivors ended")
	waitReleased(t, threshold, 10*time.Second, "the survivors' end")
}

// TestReleaseMemoryFollowsUpAPeakRelease: the openings of a burst stop
// (a run's end), so a release runs at its peak and its floor holds the
// burst. No look again while the load holds there; once it has fallen
// and settled, the burst's memory goes back, though the burst's end saw
// nothing to release (bench/soak, where each wave's peak is released).
func TestReleaseMemoryFollowsUpAPeakRelease(t *testing.T) {
	const threshold = 4 << 20
	open, started := releaserAtRest(t, threshold)
	before := forcedCollections()
	open.Store(1000)
	started.Add(1000)
	held := make([][]byte, 0, 64<<10)
	for range 64 << 10 {
		held = append(held, make([]byte, 1<<10))
	}
	// A release is two collections (check); a sleep for the second made
	// a slow one look like a look again.
	if !waitCollections(before + 2) {
		t.Fatal("no release once the openings stopped")
	}
	atPeak := forcedCollections()
	time.Sleep((settlePolls + 4) * loadPoll)
	if n := forcedCollections(); n != atPeak {
		t.Errorf("%d more collections while the load held at its peak: a look again that cannot find anything", n-atPeak)
	}
	runtime.KeepAlive(held)
	held = nil
	open.Store(0)
	waitLiveBelow(t, 32<<20, "the burst closed")
	waitReleased(t, threshold, 10*time.Second, "the burst's close")
}

// TestReleaseMemoryFollowsUpAPartialClose: a burst closes in two steps,
// and the load settles between them. The look again at the first step
// finds the first half's memory; the second half, still in use then, is
// looked for again once the load settles lower, rather than taken for the
// process's memory at rest and kept until a collection of its own.
func TestReleaseMemoryFollowsUpAPartialClose(t *testing.T) {
	const threshold = 4 << 20
	open, started := releaserAtRest(t, threshold)
	// The burst's memory comes first, so that the release at its peak
	// (the openings stop) finds all of it in use.
	first, second := make([][]byte, 0, 32<<10), make([][]byte, 0, 32<<10)
	for range 32 << 10 {
		first = append(first, make([]byte, 1<<10))
		second = append(second, make([]byte, 1<<10))
	}
	before := forcedCollections()
	open.Store(1000)
	started.Add(1000)
	if !waitCollections(before + 2) {
		t.Fatal("no release once the openings stopped")
	}
	// Half the burst closes and the load stays there: the look again
	// runs and finds the first half.
	runtime.KeepAlive(first)
	first = nil
	open.Store(500)
	waitLiveBelow(t, 48<<20, "the first half closed")
	waitReleased(t, threshold, 10*time.Second, "the first half's close")
	runtime.KeepAlive(second)
	second = nil
	open.Store(0)
	waitLiveBelow(t, 16<<20, "the second half closed")
	waitReleased(t, threshold, 10*time.Second, "the second half's close")
}

// releaserAtRest runs ReleaseMemory with collections off but its own and
// the test's, an hour between ticks, and a load with both counts, after a
// first run of connections has been released: its floor is the rest
// level. The test moves the load.
func releaserAtRest(t *testing.T, threshold uint64) (open, started *atomic.Int64) {
	gcPercent := debug.SetGCPercent(-1)
	t.Cleanup(func() { debug.SetGCPercent(gcPercent) }) // registered first: runs after the releaser stops
	runtime.GC()
	debug.FreeOSMemory()
	open, started = new(atomic.Int64), new(atomic.Int64)
	runReleaser(t, time.Hour, threshold, Load{Open: open.Load, Started: started.Load})
	time.Sleep(2 * loadPoll) // the releaser has read where the load starts
	started.Add(2 * burstMin)
	makeGarbage(8 << 20)
	waitReleased(t, threshold, 10*time.Second, "the first run")
	time.Sleep(2 * loadPoll) // the releaser has noted the run as released
	return open, started
}

// releaserAtPeak runs ReleaseMemory with collections off but its own and
// the test's, nothing to release at the start, an hour between ticks, and
// a load of 1,000 open that it has seen; the test moves the load.
func releaserAtPeak(t *testing.T, threshold uint64) *atomic.Int64 {
	gcPercent := debug.SetGCPercent(-1)
	t.Cleanup(func() { debug.SetGCPercent(gcPercent) }) // registered first: runs after the releaser stops
	runtime.GC()
	debug.FreeOSMemory()
	var load atomic.Int64
	load.Store(1000)
	runReleaser(t, time.Hour, threshold, Load{Open: load.Load})
	time.Sleep(2 * loadPoll) // the peak is seen
	return &load
}

// forcedCollections counts the collections forced so far (a release's).
func forcedCollections() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// waitCollections reports whether at least n collections have been
// forced within 10 s.
func waitCollections(n uint64) bool {
	deadline := time.Now().Add(10 * time.Second)
	for forcedCollections() < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// waitLiveBelow fails the test unless the live heap is under n within
// 10 s of after: the memory of what ended was kept.
func waitLiveBelow(t *testing.T, n uint64, after string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for liveHeap() >= n {
		if time.Now().After(deadline) {
			t.Fatalf("live heap still %d bytes 10 s after %s: its memory was kept", liveHeap(), after)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// liveHeap is the heap the last collection marked live.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: liveHeapMetric}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestReleaseMemoryAfterARun: connections started one at a time (never
// more than one open: no burst) and then none for two polls release the
// run's garbage, with the tick an hour away; while they keep starting,
// nothing is released.
func TestReleaseMemoryAfterARun(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	const threshold = 4 << 20
	runtime.GC()
	debug.FreeOSMemory()
	var open, started atomic.Int64
	runReleaser(t, time.Hour, threshold, Load{Open: open.Load, Started: started.Load})
	var garbage [][]byte
	for range 2 * burstMin {
		open.Store(1)
		started.Add(1)
		for range 64 {
			garbage = append(garbage, make([]byte, 1<<10))
		}
		open.Store(0)
		time.Sleep(loadPoll / 25) // every poll sees a start
	}
	runtime.KeepAlive(garbage)
	garbage = nil
	if f := reclaimableNow(); f < threshold {
		t.Fatalf("released while connections kept starting (%d bytes reclaimable)", f)
	}
	waitReleased(t, threshold, 10*time.Second, "the run's end")
}

// TestReleaseMemoryLeavesABusyProcess: a tick after which a collection
// completed finds the process busy and does not release (a release would
// only make the heap grow back); a tick with none since finds it quiet,
// and the release's own collections do not make it busy. Then, through
// ReleaseMemory, a quiet process with garbage is released.
func TestReleaseMemoryLeavesABusyProcess(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no collection but the test's
	r := newReleaser(64 << 10)
	runtime.GC() // the process collected by itself since the releaser started
	if r.quiet() {
		t.Error("quiet right after a collection")
	}
	if !r.quiet() {
		t.Error("busy with no collection since the last tick")
	}
	garbage := make([]byte, 1<<20)
	runtime.KeepAlive(garbage)
	garbage = nil
	if !r.check() {
		t.Fatal("no release with 1 MiB of garbage")
	}
	if !r.quiet() {
		t.Error("the release's own collections made the process busy")
	}

	before := forcedCollections()
	sink := make([]byte, 1<<20) // garbage left for the quiet release
	runtime.KeepAlive(sink)
	sink = nil
	runReleaser(t, 20*time.Millisecond, 64<<10, Load{})
	if !waitCollections(before + 1) {
		t.Fatal("no release 10 s after the process went quiet")
	}
}

// reclaimableNow is what ReleaseMemory would count as reclaimable now.
func reclaimableNow() uint64 {
	r, _ := reclaimable([]metrics.Sample{{Name: freeHeapMetric}, {Name: heapObjectsMetric}, {Name: liveHeapMetric}})
	return r
}

// runReleaser runs ReleaseMemory until the test ends.
func runReleaser(t *testing.T, interval time.Duration, threshold uint64, load Load) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ReleaseMemory(ctx, interval, threshold, load)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// makeGarbage allocates n bytes in 1 KiB objects and drops them, as a
// burst's connections leave their memory.
func makeGarbage(n int) {
	burst := make([][]byte, 0, n>>10)
	for range n >> 10 {
		burst = append(burst, make([]byte, 1<<10))
	}
	runtime.KeepAlive(burst)
}

// waitReleased fails the test unless less than threshold is reclaimable
// within d; after names the event the release should follow.
func waitReleased(t *testing.T, threshold uint64, d time.Duration, after string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for reclaimableNow() >= threshold {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still reclaimable %v after %s", reclaimableNow(), d, after)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
