package main

import (
	"cmp"
	"context"
	"slices"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// wantedIdentities are the identities the node proxy prefetches and keeps
// certificates for: those of the workloads on node that use HBONE
// (docs/protocol.md#identity), sorted and without duplicates.
func wantedIdentities(snap *state.Snapshot, node string) []identity.Identity {
	var ids []identity.Identity
	for _, w := range snap.WorkloadsOnNode(node) {
		if w.Protocol == state.TunnelHBONE || w.NativeTunnel {
			ids = append(ids, w.Identity())
		}
	}
	slices.SortFunc(ids, func(a, b identity.Identity) int {
		return cmp.Or(cmp.Compare(a.TrustDomain, b.TrustDomain), cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.ServiceAccount, b.ServiceAccount))
	})
	return slices.Compact(ids)
}

// watchWanted keeps certs' wanted set equal to wantedIdentities of the
// latest snapshot until ctx is done.
func watchWanted(ctx context.Context, store *state.Store, node string, setWanted func([]identity.Identity)) {
	for {
		snap := store.Load()
		setWanted(wantedIdentities(snap, node))
		select {
		case <-snap.Changed():
		case <-ctx.Done():
			return
		}
	}
}
