package hbone

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// burstTask is a splice worker task that dispatches a child task from the
// worker, as an abort does (it passes the tunnel's end on).
type burstTask struct {
	wg    *sync.WaitGroup
	child bool
}

func (b *burstTask) run() {
	if !b.child {
		splicePoll.dispatch(&burstTask{wg: b.wg, child: true})
	}
	b.wg.Done()
}

// TestSpliceDispatchBurst dispatches three queues' worth of tasks at once,
// each dispatching another from its worker: every one runs (a dispatch
// never waits, so workers cannot all block on a full queue), and the
// burst does not get a goroutine per task (the overflow list).
func TestSpliceDispatchBurst(t *testing.T) {
	if err := splicePoll.init(); err != nil {
		t.Skip(err)
	}
	const n = 3 * queueLen
	var wg sync.WaitGroup
	wg.Add(2 * n)
	before := runtime.NumGoroutine()
	peak := before
	for range n {
		splicePoll.dispatch(&burstTask{wg: &wg})
		peak = max(peak, runtime.NumGoroutine())
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("not every dispatched task ran")
	}
	if grew := peak - before; grew > int(maxRunning)+8 {
		t.Errorf("%d goroutines more during a burst of %d tasks; want at most the %d workers", grew, 2*n, maxRunning)
	}
}
