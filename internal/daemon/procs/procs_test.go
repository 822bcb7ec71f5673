package procs

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
)

func TestNext(t *testing.T) {
	c := Config{Max: 4, Up: 0.6, Down: 0.35, DownAfter: 3}
	for _, tc := range []struct {
		name           string
		cur            int
		cores          float64
		low            int
		wantN, wantLow int
	}{
		{"one P, light", 1, 0.2, 0, 1, 0},
		{"one P, at the threshold", 1, 0.6, 0, 1, 0},
		{"one P, busy: all at once", 1, 0.61, 0, 4, 0},
		{"max, busy", 4, 1.5, 2, 4, 0},
		{"max, between the thresholds resets the count", 4, 0.4, 2, 4, 0},
		{"max, first low reading", 4, 0.1, 0, 4, 1},
		{"max, second low reading", 4, 0.1, 1, 4, 2},
		{"max, low for DownAfter readings", 4, 0.1, 2, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, low := c.next(tc.cur, tc.cores, tc.low)
			if n != tc.wantN || low != tc.wantLow {
				t.Fatalf("next(%d, %v, %d) = %d, %d; want %d, %d", tc.cur, tc.cores, tc.low, n, low, tc.wantN, tc.wantLow)
			}
		})
	}
}

// TestRunFollowsLoad drives run with a process that burns a set number of
// cores and checks the P counts it sets.
func TestRunFollowsLoad(t *testing.T) {
	var load atomic.Int64 // milli-cores
	start := time.Now()
	var mu sync.Mutex
	var used time.Duration
	var lastAt time.Time = start
	usage := func() time.Duration { // CPU time accrues at the current load
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		used += time.Duration(float64(now.Sub(lastAt)) * float64(load.Load()) / 1000)
		lastAt = now
		return used
	}
	sets := make(chan int, 100)
	set := func(n int) int { sets <- n; return n }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		run(ctx, Config{Max: 2, Interval: 5 * time.Millisecond, Up: 0.6, Down: 0.35, DownAfter: 4}.withDefaults(), zap.NewNop(), usage, set)
		close(done)
	}()
	want := func(n int) {
		t.Helper()
		select {
		case got := <-sets:
			if got != n {
				t.Fatalf("set GOMAXPROCS %d, want %d", got, n)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("GOMAXPROCS not set to %d", n)
		}
	}
	want(1) // starts on one P
	load.Store(900)
	want(2)
	load.Store(100)
	want(1)
	cancel()
	want(2) // restored on the way out
	<-done
}

func TestRunNothingToAdapt(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	done := make(chan struct{})
	go func() {
		Run(context.Background(), Config{Max: 1}, zap.NewNop()) // one P is all there is
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run with a ceiling of one did not return")
	}
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("GOMAXPROCS %d after Run, want %d untouched", got, before)
	}
}
