package inpod

import (
	"cmp"
	"slices"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod/inpodstate"
)

// Pod states in a dump (see inpodstate).
const (
	StateUp       = inpodstate.StateUp
	StatePending  = inpodstate.StatePending
	StateDraining = inpodstate.StateDraining
)

// PodState is one pod in the admin config dump; the type lives in the leaf
// package inpodstate so dump readers need not link the proxy.
type PodState = inpodstate.PodState

// Dump is the manager's state for the admin config dump (inpodstate.Dump).
type Dump = inpodstate.Dump

// Dump reports every pod the manager knows.
func (m *Manager) Dump() Dump {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := Dump{SnapshotReceived: m.snapshotReceived, Pods: make(map[string]PodState, len(m.running)+len(m.pending))}
	for uid, e := range m.running {
		d.Pods[uid] = e.dump(StateUp)
	}
	for uid, e := range m.pending {
		d.Pods[uid] = e.dump(StatePending)
	}
	for e := range m.draining {
		d.Draining = append(d.Draining, e.dump(StateDraining))
	}
	slices.SortFunc(d.Draining, func(a, b PodState) int { return cmp.Compare(a.Info.UID, b.Info.UID) })
	return d
}

func (e *entry) dump(state string) PodState {
	s := PodState{Info: e.w, State: state, Netns: e.ns.String()}
	if !e.since.IsZero() {
		s.Since = e.since.UTC().Format(time.RFC3339)
	}
	if e.lastErr != nil {
		s.LastError = e.lastErr.Error()
	}
	return s
}
