package state

// Copy-on-write indexes.
//
// Every index is a shardMap: 256 plain Go maps chosen by a hash of the key.
// A Snapshot's shardMaps are never written. An update (one Apply call) edits
// through a shardEditor, which copies the 256-pointer shard table once (2 KiB)
// and clones only the shards it touches, the first time it touches each; later
// writes in the same call go straight into the clone. So a one-resource update
// on a 100k-workload snapshot copies a handful of ~400-entry shards per index
// instead of rebuilding anything, and a full sync writes every entry once.
// Untouched indexes are shared with the previous snapshot as they are.
//
// List-valued indexes (endpoints of a service, workloads on a node, services
// by VIP or hostname, policies by namespace) hold immutable slices; an edit
// clones the slice of each touched key once per Apply call and keeps a lazy
// position map for O(1) removal from long lists.
//
// Invariants: a published shardMap, shard map or list slice is never written
// again; editors are used by one goroutine (the Store's writer lock holder).

import (
	"encoding/binary"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

const shardCount = 256

type shardMap[K comparable, V any] struct {
	shards [shardCount]map[K]V
	n      int
	hash   func(K) uint64
}

func newShardMap[K comparable, V any](hash func(K) uint64) *shardMap[K, V] {
	return &shardMap[K, V]{hash: hash}
}

func (m *shardMap[K, V]) get(k K) (V, bool) {
	if m.n == 0 {
		var zero V
		return zero, false
	}
	v, ok := m.shards[m.hash(k)%shardCount][k]
	return v, ok
}

func (m *shardMap[K, V]) len() int { return m.n }

// all iterates in no particular order.
func (m *shardMap[K, V]) all() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		for _, s := range m.shards {
			for k, v := range s {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

type shardEditor[K comparable, V any] struct {
	old   *shardMap[K, V]
	cur   *shardMap[K, V] // nil until the first write
	owned [shardCount / 64]uint64
	hint  int // capacity of shards created from nothing
}

// expect presizes shards created from nothing for n entries in total, so a
// bulk load does not rehash while growing. Exact n matters: Go maps round
// capacity up to a power of two, so over-estimating can double a shard.
func (e *shardEditor[K, V]) expect(n int) { e.hint = n / shardCount }

func (e *shardEditor[K, V]) init(old *shardMap[K, V]) { e.old = old }

func (e *shardEditor[K, V]) get(k K) (V, bool) {
	if e.cur != nil {
		return e.cur.get(k)
	}
	return e.old.get(k)
}

// shard returns the writable shard for k, cloning it on first touch.
func (e *shardEditor[K, V]) shard(k K) map[K]V {
	if e.cur == nil {
		c := *e.old
		e.cur = &c
	}
	i := e.old.hash(k) % shardCount
	if e.owned[i/64]&(1<<(i%64)) == 0 {
		if s := e.cur.shards[i]; s != nil {
			e.cur.shards[i] = maps.Clone(s)
		} else {
			e.cur.shards[i] = make(map[K]V, e.hint)
		}
		e.owned[i/64] |= 1 << (i % 64)
	}
	return e.cur.shards[i]
}

func (e *shardEditor[K, V]) set(k K, v V) {
	s := e.shard(k)
	if _, ok := s[k]; !ok {
		e.cur.n++
	}
	s[k] = v
}

func (e *shardEditor[K, V]) delete(k K) {
	if _, ok := e.get(k); !ok {
		return
	}
	delete(e.shard(k), k)
	e.cur.n--
}

// result is the edited map, or the old one when nothing was written.
func (e *shardEditor[K, V]) result() *shardMap[K, V] {
	if e.cur == nil {
		return e.old
	}
	return e.cur
}

// listEditor edits a shardMap[K, []V] whose values are lists of items with
// unique string ids.
type listEditor[K comparable, V any] struct {
	m  shardEditor[K, []V]
	id func(V) string
	// sorted lists are sorted by id when committed (for deterministic
	// results); unsorted lists keep insertion order with swap-removal.
	sorted bool
	dirty  map[K]*listBuild[V]
}

type listBuild[V any] struct {
	items []V
	pos   map[string]int // lazily built for long lists
}

// posThreshold is the list length above which removal uses a position map.
const posThreshold = 32

func (e *listEditor[K, V]) init(old *shardMap[K, []V], id func(V) string, sorted bool) {
	e.m.init(old)
	e.id = id
	e.sorted = sorted
}

func (e *listEditor[K, V]) build(k K) *listBuild[V] {
	if b := e.dirty[k]; b != nil {
		return b
	}
	if e.dirty == nil {
		e.dirty = make(map[K]*listBuild[V])
	}
	cur, _ := e.m.get(k)
	b := &listBuild[V]{items: slices.Clone(cur)}
	e.dirty[k] = b
	return b
}

func (e *listEditor[K, V]) add(k K, v V) {
	b := e.build(k)
	if b.pos != nil {
		b.pos[e.id(v)] = len(b.items)
	}
	b.items = append(b.items, v)
}

func (e *listEditor[K, V]) remove(k K, id string) {
	if e.dirty[k] == nil {
		if _, ok := e.m.get(k); !ok {
			return
		}
	}
	b := e.build(k)
	if b.pos == nil && len(b.items) > posThreshold {
		b.pos = make(map[string]int, len(b.items))
		for j, it := range b.items {
			b.pos[e.id(it)] = j
		}
	}
	i := -1
	if b.pos != nil {
		if j, ok := b.pos[id]; ok {
			i = j
			delete(b.pos, id)
		}
	} else {
		for j, it := range b.items {
			if e.id(it) == id {
				i = j
				break
			}
		}
	}
	if i < 0 {
		return
	}
	last := len(b.items) - 1
	if i != last {
		b.items[i] = b.items[last]
		if b.pos != nil {
			b.pos[e.id(b.items[i])] = i
		}
	}
	var zero V
	b.items[last] = zero
	b.items = b.items[:last]
}

func (e *listEditor[K, V]) result() *shardMap[K, []V] {
	for k, b := range e.dirty {
		if len(b.items) == 0 {
			e.m.delete(k)
			continue
		}
		if e.sorted {
			slices.SortFunc(b.items, func(x, y V) int { return strings.Compare(e.id(x), e.id(y)) })
		}
		e.m.set(k, slices.Clip(b.items))
	}
	e.dirty = nil
	return e.m.result()
}

// Hashes choose shards only; the maps inside are Go maps with their own
// seeded hashing, so these need spread, not secrecy.

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return mix(h)
}

func hashBytes(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return mix(h)
}

// netAddr keys the by-IP indexes.
type netAddr struct {
	network string
	ip      netip.Addr
}

func hashNetAddr(k netAddr) uint64 {
	b := k.ip.As16()
	h := hashString(k.network)
	h ^= binary.LittleEndian.Uint64(b[:8])
	h = mix(h)
	h ^= binary.LittleEndian.Uint64(b[8:])
	return mix(h)
}

// mix is the splitmix64 finalizer.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
