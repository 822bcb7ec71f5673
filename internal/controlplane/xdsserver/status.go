package xdsserver

import (
	"sort"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// streamStatus is what a stream records for Status; the run goroutine
// writes it, Status reads it, both under mu.
type streamStatus struct {
	mu        sync.Mutex
	connected time.Time
	pod, node string
	version   string
	types     map[string]*xds.TypeStatus
}

func (ss *streamStatus) typ(typeURL string) *xds.TypeStatus {
	if ss.types == nil {
		ss.types = map[string]*xds.TypeStatus{}
	}
	t := ss.types[typeURL]
	if t == nil {
		t = &xds.TypeStatus{TypeURL: typeURL}
		ss.types[typeURL] = t
	}
	return t
}

// noteNode records the pod, node and version the node metadata carries.
func (ss *streamStatus) noteNode(fields map[string]string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.pod = fields["NAME"]
	if ns := fields["NAMESPACE"]; ns != "" {
		ss.pod = ns + "/" + ss.pod
	}
	ss.node, ss.version = fields["NODE_NAME"], fields["ISTIO_VERSION"]
}

// noteSubscription records typeURL's subscription after a request.
func (ss *streamStatus) noteSubscription(typeURL string, sub *subscription) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t := ss.typ(typeURL)
	t.Wildcard, t.Names, t.Held = sub.wildcard, len(sub.names), len(sub.sent)
}

// noteSent records a response sent with nonce.
func (ss *streamStatus) noteSent(typeURL, nonce string, sub *subscription, now time.Time) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t := ss.typ(typeURL)
	t.LastSent, t.SentAt, t.Held = nonce, now, len(sub.sent)
}

// noteReply records the client's ACK (nack == "") or NACK of nonce.
func (ss *streamStatus) noteReply(typeURL, nonce string, nack bool, msg string, now time.Time) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	t := ss.typ(typeURL)
	if nack {
		t.NACK = msg
		if t.NACK == "" {
			t.NACK = "rejected without a message"
		}
		return
	}
	t.LastAcked, t.AckedAt, t.NACK = nonce, now, ""
}

func (ss *streamStatus) snapshot() ([]xds.TypeStatus, string, string, string, time.Time) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]xds.TypeStatus, 0, len(ss.types))
	for _, t := range ss.types {
		c := *t
		switch {
		case c.LastSent == "":
			c.Sync = xds.SyncNotSent
		case c.LastAcked == c.LastSent && c.NACK == "":
			c.Sync = xds.SyncSynced
		default:
			c.Sync = xds.SyncStale
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TypeURL < out[j].TypeURL })
	return out, ss.pod, ss.node, ss.version, ss.connected
}

// Status returns the connected streams and the sync state of each type they
// subscribe to, sorted by node id then stream. It takes the server's stream
// lock and each stream's status lock briefly; it never waits on a stream's
// goroutine or its network.
func (s *Server) Status() []xds.StreamStatus {
	s.mu.Lock()
	streams := make([]*stream, 0, len(s.streams))
	for st := range s.streams {
		streams = append(streams, st)
	}
	s.mu.Unlock()
	out := make([]xds.StreamStatus, 0, len(streams))
	for _, st := range streams {
		types, pod, node, version, connected := st.status.snapshot()
		ss := xds.StreamStatus{Stream: st.id, Kind: xds.KindNodeProxy, Peer: st.peer, Pod: pod, Node: node,
			Version: version, Connected: connected, Types: types}
		if id := st.nodeID.Load(); id != nil {
			ss.NodeID = *id
		}
		for _, t := range types {
			if t.TypeURL == xds.WaypointType {
				ss.Kind = xds.KindWaypoint
			}
		}
		out = append(out, ss)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].NodeID != out[j].NodeID {
			return out[i].NodeID < out[j].NodeID
		}
		return out[i].Stream < out[j].Stream
	})
	return out
}
