// Package resmap is an immutable map from xDS resource name to a value,
// from which a changed copy is derived in time proportional to the change:
// 4096 plain Go maps chosen by a hash of the name, held in 64 tables of 64,
// and an edit clones only the tables and shards it writes (the first time
// it writes each). A 55k-entry map costs ~10 ms to clone whole; one edit
// here copies the 512-byte top table, one 512-byte table and one
// ~13-entry shard. (With one table of 1024 shards of ~50 entries, each
// edit copied the 8 KiB table and a shard of ~2.3 kB; a change of a
// hundred addresses, such as a namespace's or a policy's, copied ~230 kB
// per map.)
//
// The translation result (translate.Result.Addresses) and the xDS server's
// per-type snapshots use it, so one pod change is O(1) end to end. It is not
// safe for concurrent edits of one Editor; a published Map is read-only and
// safe for any number of readers.
package resmap

import (
	"iter"
	"maps"
	"sort"
)

const (
	tableSize  = 64
	shardCount = tableSize * tableSize
)

// Map is an immutable name → V map. The nil *Map is the empty map.
type Map[V any] struct {
	tables [tableSize]*table[V] // nil: all its shards empty
	n      int
}

// table is 64 shards (nil: empty).
type table[V any] [tableSize]map[string]V

// shard is FNV-1a of the name, reduced to a shard index.
func shard(k string) int {
	h := uint32(2166136261)
	for i := 0; i < len(k); i++ {
		h ^= uint32(k[i])
		h *= 16777619
	}
	return int(h % shardCount)
}

// shardOf is the shard i of m (nil when empty).
func (m *Map[V]) shardOf(i int) map[string]V {
	if t := m.tables[i/tableSize]; t != nil {
		return t[i%tableSize]
	}
	return nil
}

// Get returns the value of k.
func (m *Map[V]) Get(k string) (V, bool) {
	if m == nil || m.n == 0 {
		var zero V
		return zero, false
	}
	v, ok := m.shardOf(shard(k))[k]
	return v, ok
}

// Len is the number of entries.
func (m *Map[V]) Len() int {
	if m == nil {
		return 0
	}
	return m.n
}

// All iterates in no particular order.
func (m *Map[V]) All() iter.Seq2[string, V] {
	return func(yield func(string, V) bool) {
		if m == nil {
			return
		}
		for _, t := range m.tables {
			if t == nil {
				continue
			}
			for _, s := range t {
				for k, v := range s {
					if !yield(k, v) {
						return
					}
				}
			}
		}
	}
}

// Keys returns the names, sorted.
func (m *Map[V]) Keys() []string {
	out := make([]string, 0, m.Len())
	for k := range m.All() {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// From builds a Map holding a copy of src.
func From[V any](src map[string]V) *Map[V] {
	e := Edit[V](nil)
	for k, v := range src {
		e.Set(k, v)
	}
	return e.Done()
}

// Editor derives a new Map from an old one. The old Map is never written.
// Until the first write it holds no copy: an edit that changes nothing
// costs nothing and gives back the old Map.
type Editor[V any] struct {
	old *Map[V]
	cur *Map[V] // nil until the first write
	// ownedTables and owned: the tables and shards of cur that are this
	// edit's copies.
	ownedTables uint64
	owned       [shardCount / 64]uint64
}

// Edit starts an edit of old (nil: the empty map).
func Edit[V any](old *Map[V]) *Editor[V] { return &Editor[V]{old: old} }

// read is the map as edited so far.
func (e *Editor[V]) read() *Map[V] {
	if e.cur != nil {
		return e.cur
	}
	return e.old
}

func (e *Editor[V]) own(i int) map[string]V {
	if e.cur == nil {
		e.cur = &Map[V]{}
		if e.old != nil {
			*e.cur = *e.old
		}
	}
	ti := i / tableSize
	if e.ownedTables&(1<<ti) == 0 {
		e.ownedTables |= 1 << ti
		t := new(table[V])
		if old := e.cur.tables[ti]; old != nil {
			*t = *old
		}
		e.cur.tables[ti] = t
	}
	t := e.cur.tables[ti]
	if e.owned[i/64]&(1<<(i%64)) == 0 {
		e.owned[i/64] |= 1 << (i % 64)
		if s := t[i%tableSize]; s != nil {
			t[i%tableSize] = maps.Clone(s)
		} else {
			t[i%tableSize] = map[string]V{}
		}
	}
	return t[i%tableSize]
}

// Get reads through the edit.
func (e *Editor[V]) Get(k string) (V, bool) { return e.read().Get(k) }

// Set adds or replaces k.
func (e *Editor[V]) Set(k string, v V) {
	s := e.own(shard(k))
	if _, ok := s[k]; !ok {
		e.cur.n++
	}
	s[k] = v
}

// Delete removes k (absent: nothing happens).
func (e *Editor[V]) Delete(k string) {
	if _, ok := e.read().Get(k); !ok {
		return
	}
	delete(e.own(shard(k)), k)
	e.cur.n--
}

// Done returns the new Map (the old one itself when nothing was written,
// an empty one for a nil old); the Editor must not be used afterwards.
func (e *Editor[V]) Done() *Map[V] {
	m := e.cur
	if m == nil {
		m = e.old
		if m == nil {
			m = &Map[V]{}
		}
	}
	e.cur, e.old = nil, nil
	return m
}
