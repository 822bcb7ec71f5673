package daemon

import (
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// TestGroupFirstErrorStops: the first task error stops every task, is
// logged once with the task's name, and is what Wait returns, even when
// other tasks fail while stopping.
func TestGroupFirstErrorStops(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	g := NewGroup(context.Background(), zap.New(core))
	boom := errors.New("boom")
	g.Go("waiter", func(ctx context.Context) error { <-ctx.Done(); return errors.New("late failure") })
	g.Go("blocked", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	g.Go("source", func(context.Context) error { return boom })
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done:
		if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "source: ") {
			t.Fatalf("Wait = %v, want source: boom", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the group did not stop after a task failed")
	}
	if n := logs.FilterMessage("task failed; stopping").Len(); n != 1 {
		t.Fatalf("%d failure lines, want 1: %v", n, logs.All())
	}
	if e := logs.FilterMessage("task failed; stopping").All()[0].ContextMap()["task"]; e != "source" {
		t.Fatalf("failure logged for task %v", e)
	}
	// The blocked task's context.Canceled is a stop, not a failure.
	if n := logs.FilterMessage("task failed while stopping").Len(); n != 1 {
		t.Fatalf("%d late failure lines, want 1 (the waiter's)", n)
	}
}

// TestGroupShutdownOrder: tasks stop in the reverse order of Go, each one's
// OnStop before its context is cancelled, one task at a time.
func TestGroupShutdownOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	g := NewGroup(ctx, zap.NewNop())
	var (
		mu    sync.Mutex
		order []string
	)
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	for _, name := range []string{"admin", "xds", "listeners"} {
		g.Go(name, func(ctx context.Context) error {
			<-ctx.Done()
			note(name + " returned")
			return nil
		}, OnStop(func() { note(name + " drain") }))
	}
	g.Go("one-shot", func(context.Context) error { return nil }, Once())
	cancel()
	if err := g.Wait(); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	want := []string{"listeners drain", "listeners returned", "xds drain", "xds returned", "admin drain", "admin returned"}
	if !slices.Equal(order, want) {
		t.Fatalf("order %q, want %q", order, want)
	}
	// A task added after the stop does not start.
	if g.Go("late", func(context.Context) error { t.Error("late task ran"); return nil }) {
		t.Error("Go reported a task started after the stop")
	}
}

// TestGroupReadiness: a task is ready while it runs and its condition holds;
// a one-shot task that finished stays ready; a stopping group is not ready;
// failing retry loops are listed below the first line.
func TestGroupReadiness(t *testing.T) {
	g := NewGroup(context.Background(), zap.NewNop())
	synced := make(chan struct{})
	g.Go("xds", func(ctx context.Context) error { <-ctx.Done(); return nil }, ReadyWhen(Closed(synced)))
	g.Go("restore", func(context.Context) error { return nil }, Once())
	retries := backoff.NewSet(nil)
	g.Readiness().ShowRetries(retries)
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		g.Readiness().ServeHTTP(rec, httptest.NewRequest("GET", ReadyPath, nil))
		return rec.Code, rec.Body.String()
	}
	waitFor := func(want func(int, string) bool) (int, string) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			code, body := get()
			if want(code, body) || time.Now().After(deadline) {
				return code, body
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// Until Wait says every task is started, startup is pending.
	if code, body := get(); code != 503 || body != "not ready, pending: startup, xds" {
		t.Fatalf("before Wait: %d %q", code, body)
	}
	waited := make(chan error, 1)
	go func() { waited <- g.Wait() }()
	if code, body := waitFor(func(_ int, b string) bool { return !strings.Contains(b, "startup") }); code != 503 || body != "not ready, pending: xds" {
		t.Fatalf("before sync: %d %q", code, body)
	}
	close(synced)
	if code, body := waitFor(func(c int, _ string) bool { return c == 200 }); code != 200 || body != "ready\n" {
		t.Fatalf("after sync: %d %q", code, body)
	}
	retries.New("certificate", backoff.Policy{}).Failed(errors.New("CA refused"))
	if _, body := get(); !strings.HasPrefix(body, "ready\n\nretrying:\n  certificate: 1 failures since ") || !strings.HasSuffix(body, ": CA refused\n") {
		t.Fatalf("with a failing loop: %q", body)
	}
	g.Stop()
	if code, _ := get(); code != 503 {
		t.Fatalf("stopping: %d, want 503", code)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
}

// TestGroupServiceEnds: a service task returning nil early stops the group
// cleanly.
func TestGroupServiceEnds(t *testing.T) {
	g := NewGroup(context.Background(), zap.NewNop())
	stopped := make(chan struct{})
	g.Go("other", func(ctx context.Context) error { <-ctx.Done(); close(stopped); return nil })
	g.Go("server", func(context.Context) error { return nil })
	if err := g.Wait(); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	select {
	case <-stopped:
	default:
		t.Fatal("the other task was not stopped")
	}
}

// TestGroupNestedLogsOnce: a group running inside another's task (the CNI
// agent's Run in its daemon's group) logs the failure once, and the outer
// Wait names both tasks.
func TestGroupNestedLogsOnce(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	outer := NewGroup(context.Background(), log)
	outer.Go("node agent", func(ctx context.Context) error {
		inner := NewGroup(ctx, log)
		inner.Go("cluster source", func(context.Context) error { return errors.New("no such directory") })
		return inner.Wait()
	})
	err := outer.Wait()
	if err == nil || err.Error() != "node agent: cluster source: no such directory" {
		t.Fatalf("Wait = %v", err)
	}
	var n int
	for _, e := range logs.All() {
		for _, f := range e.Context {
			if f.Key == "error" {
				n++
			}
		}
	}
	if n != 1 {
		t.Fatalf("the error was logged %d times, want once: %v", n, logs.All())
	}
}
