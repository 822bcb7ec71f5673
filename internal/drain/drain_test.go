package drain_test

import (
	"context"
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
