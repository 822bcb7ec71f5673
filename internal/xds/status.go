package xds

import "time"

// Sync states of one type on one stream, as Server.Status reports them (the
// words istioctl proxy-status uses).
const (
	// SyncSynced: the last response sent was acknowledged.
	SyncSynced = "SYNCED"
	// SyncStale: a newer response is unacknowledged, or was rejected (NACK).
	SyncStale = "STALE"
	// SyncNotSent: the type is subscribed but nothing was sent yet.
	SyncNotSent = "NOT SENT"
)

// Stream kinds, told apart by what they subscribe to.
const (
	KindNodeProxy = "node proxy"
	KindWaypoint  = "waypoint" // subscribed to WaypointType
)

// StreamStatus is one connected stream as Server.Status reports it.
type StreamStatus struct {
	Stream    int64        `json:"stream"`
	Kind      string       `json:"kind"`   // KindNodeProxy or KindWaypoint
	NodeID    string       `json:"nodeId"` // "" until the first request names it
	Peer      string       `json:"peer"`   // remote address
	Pod       string       `json:"pod"`    // namespace/name, from the node metadata
	Node      string       `json:"node"`   // NODE_NAME metadata
	Version   string       `json:"version"`
	Connected time.Time    `json:"connected"`
	Types     []TypeStatus `json:"types"` // sorted by type URL
}

// TypeStatus is the state of one subscribed type on a stream.
type TypeStatus struct {
	TypeURL  string `json:"typeUrl"`
	Sync     string `json:"sync"` // SyncSynced, SyncStale or SyncNotSent
	Wildcard bool   `json:"wildcard"`
	// Names: explicitly subscribed names; Held: resources the client holds
	// by the server's account (what it sent, or the client declared).
	Names     int       `json:"names"`
	Held      int       `json:"held"`
	LastSent  string    `json:"lastSentNonce,omitempty"`
	SentAt    time.Time `json:"sentAt,omitzero"`
	LastAcked string    `json:"lastAckedNonce,omitempty"`
	AckedAt   time.Time `json:"ackedAt,omitzero"`
	// NACK is the client's error message when its last reply rejected the
	// last response it was sent.
	NACK string `json:"nack,omitempty"`
}
