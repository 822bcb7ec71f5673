package proxy

// shrinkSet is a set of open connections that gives its memory back after
// a burst: a Go map keeps the buckets of the most entries it ever held (a
// map that once held 10,000 pointers holds ~300 KiB after they are all
// deleted), so the map is dropped when the set empties and rebuilt at its
// size once it holds a quarter of its peak or less. Each rebuild copies at
// most a third of the deletions since the last, so add and remove stay O(1)
// amortised. The zero value is empty; callers lock.
type shrinkSet[T comparable] struct {
	m    map[T]struct{}
	peak int // the most entries m held since it was made
}

// shrinkMinPeak: a map that never held more stays as it is.
const shrinkMinPeak = 64

func (s *shrinkSet[T]) add(v T) {
	if s.m == nil {
		s.m = make(map[T]struct{})
	}
	s.m[v] = struct{}{}
	s.peak = max(s.peak, len(s.m))
}

func (s *shrinkSet[T]) remove(v T) {
	delete(s.m, v)
	switch n := len(s.m); {
	case n == 0:
		s.m, s.peak = nil, 0
	case s.peak >= shrinkMinPeak && n <= s.peak/4:
		// A new map, not maps.Clone: a clone keeps the original's size.
		small := make(map[T]struct{}, n)
		for v := range s.m {
			small[v] = struct{}{}
		}
		s.m, s.peak = small, n
	}
}

func (s *shrinkSet[T]) len() int { return len(s.m) }

// all ranges over the set (nil when empty: ranging over it does nothing).
func (s *shrinkSet[T]) all() map[T]struct{} { return s.m }
