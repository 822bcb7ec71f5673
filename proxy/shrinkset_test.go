package proxy

import "testing"

// TestShrinkSetGivesBackItsPeak: after a burst the set holds a map of its
// current size, not of the burst's, and none once empty.
func TestShrinkSetGivesBackItsPeak(t *testing.T) {
	var s shrinkSet[int]
	const n = 10000
	for i := range n {
		s.add(i)
	}
	for i := range n - 10 {
		s.remove(i)
	}
	if s.len() != 10 || s.peak > 4*10 {
		t.Errorf("after removing all but 10 of %d: %d held, peak %d; want 10 held and a map rebuilt near that size", n, s.len(), s.peak)
	}
	for i := n - 10; i < n; i++ {
		if _, ok := s.all()[i]; !ok {
			t.Fatalf("%d lost in a rebuild", i)
		}
	}
	for i := n - 10; i < n; i++ {
		s.remove(i)
	}
	if s.all() != nil || s.peak != 0 {
		t.Errorf("empty set still holds a map (%v, peak %d)", s.all(), s.peak)
	}
}
