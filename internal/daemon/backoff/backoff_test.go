package backoff

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestDelay(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: -1}
	for failures, want := range map[int]time.Duration{
		0: 100 * time.Millisecond, 1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond,
		5: time.Second, 100: time.Second, 1 << 40: time.Second,
	} {
		if got := p.Delay(failures, 0.5); got != want {
			t.Errorf("Delay(%d) = %v, want %v", failures, got, want)
		}
	}
	// Jitter stays within its range and under the cap.
	j := Policy{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: 0.2}
	if lo, hi := j.Delay(1, 0), j.Delay(1, 0.999); lo != 80*time.Millisecond || hi < 119*time.Millisecond || hi > 120*time.Millisecond {
		t.Errorf("jittered first delay in [%v, %v], want [80ms, 120ms]", lo, hi)
	}
	if d := j.Delay(50, 0.999); d != time.Second {
		t.Errorf("jittered capped delay = %v, want the cap", d)
	}
	// Defaults: 100 ms to 30 s, ±20 %.
	if d := (Policy{}).Delay(1, 0.5); d != 100*time.Millisecond {
		t.Errorf("default first delay = %v", d)
	}
	if d := (Policy{}).Delay(1000, 0.999); d != 30*time.Second {
		t.Errorf("default cap = %v", d)
	}
}

// TestRetryLogsOncePerStep: a loop failing ten thousand times logs one line
// per backoff step up to the cap, then nothing until it recovers, and one
// line when it does.
func TestRetryLogsOncePerStep(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	set := NewSet(zap.New(core))
	r := set.New("certificate", Policy{Initial: 10 * time.Millisecond, Max: 160 * time.Millisecond})
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	cause := errors.New("connection refused")
	for range 10000 {
		r.Failed(cause)
		now = now.Add(time.Millisecond)
	}
	// Steps 0..4 (10, 20, 40, 80, 160 ms): five lines.
	if n := logs.Len(); n != 5 {
		t.Fatalf("%d log lines for 10000 failures, want 5 (one per step):\n%v", n, logs.All())
	}
	st := set.Failing()
	if len(st) != 1 || st[0].Failures != 10000 || st[0].Step != 4 || st[0].LastError != "connection refused" ||
		!st[0].Since.Equal(time.Unix(1000, 0)) || !st[0].NextRetry.After(now.Add(-time.Millisecond)) {
		t.Fatalf("failing = %+v", st)
	}
	r.Succeeded()
	if n := logs.FilterMessage("certificate recovered").Len(); n != 1 {
		t.Fatalf("%d recovery lines, want 1", n)
	}
	r.Succeeded()
	if logs.Len() != 6 || len(set.Failing()) != 0 || set.Status()[0].Succeeded.IsZero() {
		t.Fatalf("after recovery: %d lines, status %+v", logs.Len(), set.Status())
	}
	// A new streak starts over at step 0, and logs again.
	r.Failed(cause)
	if logs.Len() != 7 || set.Status()[0].Step != 0 {
		t.Fatalf("new streak: %d lines, status %+v", logs.Len(), set.Status())
	}
}

func TestRetryWaitEndsWithContext(t *testing.T) {
	r := New("x", Policy{Initial: time.Hour}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Wait(ctx, errors.New("down")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v", err)
	}
	r2 := New("y", Policy{Initial: time.Millisecond, Jitter: -1}, nil)
	if err := r2.Wait(context.Background(), nil); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	var nilSet *Set
	if nilSet.New("z", Policy{}) == nil || nilSet.Status() != nil {
		t.Fatal("a nil Set still makes Retries and reports none")
	}
}

// TestRetryHealthy: a success that does not last Healthy leaves the next
// failure at the following step; one that does starts over.
func TestRetryHealthy(t *testing.T) {
	r := New("xds", Policy{Initial: 10 * time.Millisecond, Max: time.Second, Jitter: -1, Healthy: time.Minute}, nil)
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	for range 3 {
		r.Failed(nil)
	}
	r.Succeeded()
	now = now.Add(time.Second)
	if d := r.Failed(nil); d != 80*time.Millisecond {
		t.Fatalf("failure 1 s after a success: wait %v, want 80ms (the fourth step)", d)
	}
	r.Succeeded()
	now = now.Add(2 * time.Minute)
	if d := r.Failed(nil); d != 10*time.Millisecond {
		t.Fatalf("failure after a lasting success: wait %v, want 10ms", d)
	}
}
