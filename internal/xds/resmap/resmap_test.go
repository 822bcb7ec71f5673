package resmap

import (
	"fmt"
	"testing"
)

func TestEditLeavesOldUntouched(t *testing.T) {
	e := Edit[int](nil)
	for i := 0; i < 1000; i++ {
		e.Set(fmt.Sprint("k", i), i)
	}
	old := e.Done()
	e = Edit(old)
	e.Set("k1", -1)
	e.Set("new", 7)
	e.Delete("k2")
	e.Delete("absent")
	next := e.Done()

	if v, _ := old.Get("k1"); v != 1 {
		t.Errorf("old k1 = %d, want 1", v)
	}
	if _, ok := old.Get("new"); ok {
		t.Error("old sees the new key")
	}
	if _, ok := old.Get("k2"); !ok || old.Len() != 1000 {
		t.Errorf("old lost k2 or changed length (%d)", old.Len())
	}
	if v, _ := next.Get("k1"); v != -1 {
		t.Errorf("next k1 = %d, want -1", v)
	}
	if _, ok := next.Get("k2"); ok {
		t.Error("next still has k2")
	}
	if next.Len() != 1000 {
		t.Errorf("next len = %d, want 1000", next.Len())
	}
	n := 0
	for range next.All() {
		n++
	}
	if n != next.Len() {
		t.Errorf("All yields %d, Len says %d", n, next.Len())
	}
	if ks := next.Keys(); len(ks) != 1000 || ks[0] != "k0" {
		t.Errorf("Keys: %d, first %q", len(ks), ks[0])
	}
	var nilMap *Map[int]
	if nilMap.Len() != 0 || len(nilMap.Keys()) != 0 {
		t.Error("nil map is not empty")
	}
}

// TestEditAllocs: one change to a large map clones one shard, not the map.
func TestEditAllocs(t *testing.T) {
	src := map[string]int{}
	for i := 0; i < 50000; i++ {
		src[fmt.Sprint("Kubernetes//Pod/ns/p", i)] = i
	}
	m := From(src)
	allocs := testing.AllocsPerRun(20, func() {
		e := Edit(m)
		e.Set("Kubernetes//Pod/ns/p7", 1)
		e.Done()
	})
	if allocs > 10 {
		t.Errorf("one edit allocates %.0f times, want a handful (one shard clone)", allocs)
	}
}

// TestEditWithoutWrites: an edit that writes nothing (a Get, a Delete of
// a missing name) gives back the old Map and copies nothing; a nil old
// Map still gives an empty Map.
func TestEditWithoutWrites(t *testing.T) {
	m := From(map[string]int{"a": 1, "b": 2})
	allocs := testing.AllocsPerRun(20, func() {
		e := Edit(m)
		e.Get("a")
		e.Delete("missing")
		if e.Done() != m {
			t.Fatal("an edit without writes gave a new Map")
		}
	})
	if allocs > 1 {
		t.Errorf("an edit without writes allocates %.0f times, want at most the Editor", allocs)
	}
	if e := Edit[int](nil); e.Done() == nil {
		t.Error("an edit of the nil Map gave nil, want an empty Map")
	}
	e := Edit(m)
	e.Delete("a")
	if next := e.Done(); next == m || next.Len() != 1 || m.Len() != 2 {
		t.Errorf("a Delete: new map %v, %d entries (old %d); want a new Map of 1, the old untouched", next != m, next.Len(), m.Len())
	}
}

// BenchmarkEdit50k: an edit of one and of a hundred names (a pod's
// change, a namespace's) of a 50k-entry map.
func BenchmarkEdit50k(b *testing.B) {
	src := map[string]int{}
	for i := 0; i < 50000; i++ {
		src[fmt.Sprint("Kubernetes//Pod/ns/p", i)] = i
	}
	m := From(src)
	for _, n := range []int{1, 100} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprint("Kubernetes//Pod/ns/p", i*491)
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				e := Edit(m)
				for _, k := range keys {
					e.Set(k, i)
				}
				e.Done()
			}
		})
	}
}
