// Package drain is the two-phase shutdown shared by every listener (STYLE
// G10): stop accepting, let live connections finish until a deadline, then
// cancel a "force" signal that every connection goroutine watches and wait for
// them to go.
//
// It does not own listeners or connections; callers close their listener and
// register each connection with Track.
package drain

import (
	"context"
	"sync"
	"time"
)

// Group counts the live connections of one listener set (one pod's
// listeners, say) and carries the force signal.
type Group struct {
	mu       sync.Mutex
	wg       sync.WaitGroup
	force    chan struct{}
	draining bool
	live     int
}

// New returns an empty group.
func New() *Group { return &Group{force: make(chan struct{})} }

// Track registers one connection. Call done exactly once when it ends.
// ok is false once Drain has started: the caller must close the connection.
func (g *Group) Track() (done func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining {
		return func() {}, false
	}
	g.wg.Add(1)
	g.live++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.live--
			g.mu.Unlock()
			g.wg.Done()
		})
	}, true
}

// Force is closed when the drain deadline passes (or Close is called):
// connection goroutines select on it and close their sockets.
func (g *Group) Force() <-chan struct{} { return g.force }

// Live reports how many tracked connections are open.
func (g *Group) Live() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.live
}

// Drain refuses new connections, waits until every tracked connection has
// ended or deadline passes (or ctx is done), then closes Force and waits for
// the rest to go (they must react to Force promptly). It reports whether all
// connections ended on their own.
func (g *Group) Drain(ctx context.Context, deadline time.Duration) (graceful bool) {
	g.mu.Lock()
	g.draining = true
	g.mu.Unlock()
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	t := time.NewTimer(deadline)
	defer t.Stop()
	select {
	case <-done:
		graceful = true
	case <-t.C:
	case <-ctx.Done():
	}
	g.closeForce()
	<-done
	return graceful
}

// Close forces every connection closed at once (a pod removed abruptly).
func (g *Group) Close() {
	g.mu.Lock()
	g.draining = true
	g.mu.Unlock()
	g.closeForce()
	g.wg.Wait()
}

func (g *Group) closeForce() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.force:
	default:
		close(g.force)
	}
}
