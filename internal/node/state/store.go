// Package state is the node proxy's view of the mesh: workloads, services and
// L4 authorization policies converted from WDS/xDS into compact, validated
// types, indexed, and published as immutable Snapshots that the data path
// reads with one atomic load and no locks.
//
// Store.ApplyAddresses and Store.ApplyAuthorizations are the only writers
// (called by internal/xds); each converts and validates its resources off to
// the side, edits copy-on-write indexes (see cow.go) and swaps the snapshot
// pointer. Store.Changed and Store.WaitFor make waiting for state explicit
// and bounded. Snapshot holds the lookups the proxy and DNS need,
// endpoint selection (SelectEndpoint) and the policies that apply to a
// workload (PoliciesFor).
//
// It is not the xDS client (internal/xds), it does not resolve hostnames, and
// it does not decide routes (proxy) or evaluate policies (internal/rbac).
package state

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
)

// Store holds the current Snapshot. Readers call Load; the xDS client calls
// the Apply methods. The zero Store is not usable; use NewStore.
type Store struct {
	cur atomic.Pointer[Snapshot]

	mu sync.Mutex // serializes writers; guards in
	in interner
}

// NewStore returns a store holding an empty snapshot (Generation 0).
func NewStore() *Store {
	s := &Store{}
	s.cur.Store(emptySnapshot())
	return s
}

// Load returns the current snapshot: one atomic load, no locks. Use the same
// snapshot for every lookup of one connection.
func (s *Store) Load() *Snapshot { return s.cur.Load() }

// Changed returns a channel that is closed when the snapshot current at the
// time of the call is replaced.
func (s *Store) Changed() <-chan struct{} { return s.cur.Load().changed }

// WaitFor returns the first snapshot (the current one or a later one) for
// which pred returns true, or ctx's error wrapped, together with the last
// snapshot checked. It subscribes to changes before checking, so no swap is
// missed. pred must not block.
func (s *Store) WaitFor(ctx context.Context, pred func(*Snapshot) bool) (*Snapshot, error) {
	for {
		snap := s.cur.Load()
		if pred(snap) {
			return snap, nil
		}
		select {
		case <-snap.changed:
		case <-ctx.Done():
			return snap, fmt.Errorf("state: wait (at generation %d): %w", snap.Generation, context.Cause(ctx))
		}
	}
}

// ApplyAddresses applies one WDS update: upserts keyed by resource name (a
// Workload's uid, a Service's "namespace/hostname") and removed names (either
// kind). Removals are applied first, then upserts (in no particular order;
// resource names are unique, so the order does not change the result).
//
// Every resource is converted and validated; an invalid one is rejected and
// keeps its previous version (or stays absent), while the valid ones of the
// same call are applied. The returned error is an *ApplyError listing the
// rejected resources, or nil. A new snapshot is published iff something
// changed.
func (s *Store) ApplyAddresses(upserts map[string]*workloadapi.Address, removes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := newBuilder(s.cur.Load())
	if len(upserts) >= 16*shardCount && b.old.NumWorkloads() == 0 {
		// First full sync: presize the per-workload indexes.
		n := 0
		for _, a := range upserts {
			if a.GetWorkload() != nil {
				n++
			}
		}
		b.workloads.expect(n)
		b.workloadIP.expect(n)
	}
	for _, name := range removes {
		if _, ok := b.workloads.get(name); ok {
			b.removeWorkload(name)
		} else {
			b.removeService(name)
		}
	}
	var errs []*ResourceError
	for _, c := range s.convertAddresses(upserts) {
		switch {
		case c.err != nil:
			errs = append(errs, resourceError(c.name, c.err))
		case c.w != nil:
			b.upsertWorkload(c.w)
		default:
			b.upsertService(c.s)
		}
	}
	s.publish(b)
	return applyError(errs)
}

// ApplyAuthorizations applies one authorization update: upserts keyed by
// "namespace/name" and removed names, with the same rules as ApplyAddresses.
func (s *Store) ApplyAuthorizations(upserts map[string]*securityapi.Authorization, removes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := newBuilder(s.cur.Load())
	for _, name := range removes {
		b.removePolicy(name)
	}
	var errs []*ResourceError
	for name, a := range upserts {
		p, err := rbac.FromProto(a)
		if err == nil && p.Key != name {
			err = ferr("name", "namespace/name %q does not match the resource name", p.Key)
		}
		if err != nil {
			re := resourceError(name, err)
			if fe := (*rbac.FieldError)(nil); errors.As(err, &fe) {
				re.Field, re.Err = fe.Field, fe.Err
			}
			errs = append(errs, re)
			continue
		}
		p.Namespace = s.in.intern(p.Namespace)
		b.upsertPolicy(p)
	}
	s.publish(b)
	return applyError(errs)
}

// converted is one converted Address: exactly one of w, s, err is set.
type converted struct {
	name string
	w    *Workload
	s    *Service
	err  error
}

// parallelThreshold is the update size from which conversion runs on all
// CPUs (full syncs); smaller updates convert inline.
const parallelThreshold = 2048

// convertAddresses converts and validates upserts. Large updates are split
// across GOMAXPROCS workers, each with a private interner; the results are
// then re-interned through the store's interner. Called with s.mu held.
func (s *Store) convertAddresses(upserts map[string]*workloadapi.Address) []converted {
	out := make([]converted, 0, len(upserts))
	ins := make([]*workloadapi.Address, 0, len(upserts))
	for name, a := range upserts {
		out = append(out, converted{name: name})
		ins = append(ins, a)
	}
	workers := runtime.GOMAXPROCS(0)
	if len(out) < parallelThreshold || workers < 2 {
		for i := range out {
			convertAddress(&s.in, ins[i], &out[i])
		}
		return out
	}
	var wg sync.WaitGroup
	chunk := (len(out) + workers - 1) / workers
	for lo := 0; lo < len(out); lo += chunk {
		hi := min(lo+chunk, len(out))
		wg.Go(func() {
			in := interner{validateOnly: true}
			for i := lo; i < hi; i++ {
				convertAddress(&in, ins[i], &out[i])
			}
		})
	}
	wg.Wait()
	for i := range out {
		switch {
		case out[i].w != nil:
			s.in.canonWorkload(out[i].w)
		case out[i].s != nil:
			s.in.canonService(out[i].s)
		}
	}
	return out
}

func convertAddress(in *interner, a *workloadapi.Address, c *converted) {
	switch {
	case a.GetWorkload() != nil:
		w, err := in.workload(a.GetWorkload())
		if err == nil && w.UID != c.name {
			err = ferr("uid", "%q does not match the resource name", w.UID)
		}
		if err != nil {
			c.err = err
			return
		}
		c.w = w
	case a.GetService() != nil:
		svc, err := in.service(a.GetService())
		if err == nil && svc.Key != c.name {
			err = ferr("hostname", "namespace/hostname %q does not match the resource name", svc.Key)
		}
		if err != nil {
			c.err = err
			return
		}
		c.s = svc
	default:
		c.err = ferr("type", "neither workload nor service")
	}
}

func applyError(errs []*ResourceError) error {
	if len(errs) == 0 {
		return nil
	}
	slices.SortFunc(errs, func(a, b *ResourceError) int { return strings.Compare(a.Resource, b.Resource) })
	return &ApplyError{Errors: errs}
}

// publish swaps in the built snapshot if anything changed and wakes waiters.
// Called with s.mu held.
func (s *Store) publish(b *builder) {
	if !b.changed {
		return
	}
	old := s.cur.Load()
	next := b.finish()
	s.cur.Store(next)
	close(old.changed)
}
