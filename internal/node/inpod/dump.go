package inpod

import (
	"cmp"
	"slices"
	"time"
)

// Pod states in a dump.
const (
	StateUp       = "Up"       // the proxy is serving
	StatePending  = "Pending"  // the proxy failed to start and is retried
	StateDraining = "Draining" // the pod was removed or replaced; its connections are finishing
)

// PodState is one pod in the admin config dump (the "workloadState"
// section; Istio's ztunnel has the same section keyed by pod UID).
type PodState struct {
	Info  Workload `json:"info"`
	State string   `json:"state"`
	// Netns is the pod's network namespace identity (dev and inode).
	Netns string `json:"netns"`
	// Since is when the proxy started (Up, Draining) or first failed
	// (Pending), RFC 3339.
	Since string `json:"since,omitempty"`
	// LastError is the latest start failure (Pending only).
	LastError string `json:"lastError,omitempty"`
}

// Dump is the manager's state for the admin config dump.
type Dump struct {
	// SnapshotReceived: the agent has sent its first full snapshot.
	SnapshotReceived bool `json:"snapshotReceived"`
	// Pods by pod UID. A pod being replaced in a new netns appears once, with
	// its new state; its draining predecessor is listed in Draining.
	Pods map[string]PodState `json:"pods"`
	// Draining lists proxies still draining, sorted by uid (a uid may
	// appear more than once).
	Draining []PodState `json:"draining,omitempty"`
}

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
