package drain_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/drain"
)

func TestGracefulWhenConnectionsFinish(t *testing.T) {
	g := drain.New()
	done, ok := g.Track()
	if !ok || g.Live() != 1 {
		t.Fatal("track failed")
	}
	go func() { time.Sleep(20 * time.Millisecond); done() }()
	if !g.Drain(context.Background(), 5*time.Second) {
		t.Fatal("drain not graceful although the connection finished")
	}
	if _, ok := g.Track(); ok {
		t.Fatal("new connection accepted while draining")
	}
	select {
	case <-g.Force():
	default:
		t.Fatal("force not closed after drain")
	}
}

func TestForceAfterDeadline(t *testing.T) {
	g := drain.New()
	done, _ := g.Track()
	closed := make(chan struct{})
	go func() { <-g.Force(); close(closed); done() }()
	start := time.Now()
	if g.Drain(context.Background(), 30*time.Millisecond) {
		t.Fatal("drain reported graceful although the connection had to be forced")
	}
	<-closed
	if time.Since(start) < 30*time.Millisecond {
		t.Fatal("forced before the deadline")
	}
	if g.Live() != 0 {
		t.Fatal("connection still live after drain returned")
	}
}

func TestCloseForcesImmediately(t *testing.T) {
	g := drain.New()
	done, _ := g.Track()
	go func() { <-g.Force(); done() }()
	g.Close()
	if g.Live() != 0 {
		t.Fatal("close returned with live connections")
	}
	done() // a second call is harmless
}

// TestContextCancelsDerived: what derives from Context (WithCancel,
// WithTimeout, AfterFunc) ends when the group is forced, and nothing that
// was stopped or cancelled before runs.
func TestContextCancelsDerived(t *testing.T) {
	g := drain.New()
	ctx := g.Context()
	if ctx.Err() != nil {
		t.Fatal("context done before force")
	}
	child, cancelChild := context.WithCancel(ctx)
	defer cancelChild()
	timed, cancelTimed := context.WithTimeout(ctx, time.Hour)
	defer cancelTimed()
	early, cancelEarly := context.WithCancel(ctx)
	cancelEarly()
	ran := make(chan struct{})
	context.AfterFunc(ctx, func() { close(ran) })
	stopped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { close(stopped) })
	if !stop() {
		t.Fatal("stop of a pending AfterFunc reported false")
	}
	g.Close()
	<-ran
	for name, c := range map[string]context.Context{"root": ctx, "WithCancel": child, "WithTimeout": timed} {
		select {
		case <-c.Done():
		default:
			t.Errorf("%s not done after Close", name)
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Errorf("%s: Err %v, want Canceled", name, c.Err())
		}
	}
	if early.Err() != context.Canceled {
		t.Errorf("cancelled child: Err %v", early.Err())
	}
	select {
	case <-stopped:
		t.Error("a stopped AfterFunc ran")
	default:
	}
	// Deriving after the force: done at once.
	late, cancelLate := context.WithCancel(ctx)
	defer cancelLate()
	<-late.Done()
}
