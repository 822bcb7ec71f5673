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
	forced   bool // under mu; force is closed
	draining bool
	live     int
	// onForce are the callbacks registered through Context, by id, run
	// once when force closes (under mu). peak is the most it held since it
	// was last made: see shrinkLocked.
	onForce map[uint64]func()
	nextID  uint64
	peak    int
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
	if g.forced {
		g.mu.Unlock()
		return
	}
	g.forced = true
	close(g.force)
	fs := g.onForce
	g.onForce, g.peak = nil, 0
	g.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Context returns a context that is done once Force is closed. It carries
// no values and no deadline; Err is context.Canceled once done.
//
// It exists for what a connection derives from it: every context.WithCancel,
// WithTimeout or AfterFunc on a context.WithCancel parent goes into that
// parent's map of children, and a Go map keeps the buckets of the most
// entries it ever held, so a listener set whose shared context once had
// 10,000 connections' children keeps about 60 bytes per peak connection for
// good. The standard library hands derived contexts to a parent's AfterFunc
// method when it has one; this context's keeps them in a set the group
// rebuilds smaller as it empties (shrinkLocked).
func (g *Group) Context() context.Context { return forceCtx{g} }

type forceCtx struct{ g *Group }

func (forceCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c forceCtx) Done() <-chan struct{}     { return c.g.force }
func (forceCtx) Value(any) any               { return nil }
func (forceCtx) String() string              { return "drain.Group.Context" }

func (c forceCtx) Err() error {
	select {
	case <-c.g.force:
		return context.Canceled
	default:
		return nil
	}
}

// AfterFunc is what the context package calls (through an interface) to
// tie a derived context, or a context.AfterFunc, to this one: f runs once
// force closes, on the goroutine that closes it (on its own goroutine when
// force is closed already), unless stop is called first; stop reports
// whether it stopped f.
func (c forceCtx) AfterFunc(f func()) (stop func() bool) {
	g := c.g
	g.mu.Lock()
	if g.forced {
		g.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	if g.onForce == nil {
		g.onForce = make(map[uint64]func())
	}
	id := g.nextID
	g.nextID++
	g.onForce[id] = f
	g.peak = max(g.peak, len(g.onForce))
	g.mu.Unlock()
	return func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		if _, ok := g.onForce[id]; !ok {
			return false
		}
		delete(g.onForce, id)
		g.shrinkLocked()
		return true
	}
}

// shrinkLocked gives back the memory of a callback set that was once much
// larger: dropped when empty, copied into a map of its size when it holds a
// quarter of its peak or less. Each copy moves at most a third of the
// deletions since the last one, so registering and stopping stay O(1)
// amortised.
func (g *Group) shrinkLocked() {
	switch n := len(g.onForce); {
	case n == 0:
		g.onForce, g.peak = nil, 0
	case g.peak >= minShrinkPeak && n <= g.peak/4:
		m := make(map[uint64]func(), n)
		for id, f := range g.onForce {
			m[id] = f
		}
		g.onForce, g.peak = m, n
	}
}

// minShrinkPeak: below this a map is small enough to keep.
const minShrinkPeak = 64
