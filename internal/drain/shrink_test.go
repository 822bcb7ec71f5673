package drain

import (
	"context"
	"testing"
)

// TestContextSetShrinks: the set behind Context does not stay at the size
// of its largest burst (a Go map would keep those buckets).
func TestContextSetShrinks(t *testing.T) {
	g := New()
	ctx := g.Context()
	const n = 10000
	cancels := make([]context.CancelFunc, n)
	for i := range n {
		_, cancels[i] = context.WithCancel(ctx)
	}
	if g.peak != n {
		t.Fatalf("peak %d after %d children, want %d", g.peak, n, n)
	}
	for _, c := range cancels[:n-10] {
		c()
	}
	if len(g.onForce) != 10 || g.peak > 4*10 {
		t.Errorf("after cancelling all but 10 children: %d held, peak %d; want 10 held and a peak the map was rebuilt at", len(g.onForce), g.peak)
	}
	for _, c := range cancels[n-10:] {
		c()
	}
	if g.onForce != nil {
		t.Errorf("empty set still holds a map of %d", len(g.onForce))
	}
}
