// Package inpodstate holds the node proxy's in-pod workload state as the
// admin config dump shows it (the "workloadState" section). It is a leaf:
// readers of a dump, such as zctl, use it without linking the proxy's
// listeners; package inpod fills it.
package inpodstate

// Pod states in a dump.
const (
	StateUp       = "Up"       // the proxy is serving
	StatePending  = "Pending"  // the proxy failed to start and is retried
	StateDraining = "Draining" // the pod was removed or replaced; its connections are finishing
)

// Workload is the pod a proxy serves, as ZDS names it.
type Workload struct {
	// UID is the Kubernetes pod UID (not the WDS workload uid).
	UID            string `json:"uid"`
	Name           string `json:"name"`
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
}

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

// Dump is the workload manager's state for the admin config dump.
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
