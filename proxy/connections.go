package proxy

import (
	"cmp"
	"slices"
	"time"
)

// ConnPeer is one end of an open connection as Connections reports it.
type ConnPeer struct {
	Addr      string `json:"addr"`
	Workload  string `json:"workload,omitempty"` // workload name from the control plane
	Namespace string `json:"namespace,omitempty"`
	// Identity: for the source only when mTLS proved it; for the
	// destination the one the proxy expects (or, inbound, its own).
	Identity string `json:"identity,omitempty"`
}

// Connection is one open connection of the node proxy (every pod's proxy
// that shares the Metrics), as the admin /connections endpoint shows it.
type Connection struct {
	Direction string    `json:"direction"` // "inbound" or "outbound"
	Start     time.Time `json:"start"`
	Src       ConnPeer  `json:"src"`
	Dst       ConnPeer  `json:"dst"`
	// HBONEAddr is the tunnel's inner authority (the real destination)
	// when the connection is tunnelled; Dst.Addr is then the next hop.
	HBONEAddr string `json:"hboneAddr,omitempty"`
	// OriginalDst is where the application connected (a service VIP or pod
	// address) when the proxy sent it elsewhere (Dst.Addr, the next hop).
	OriginalDst string `json:"originalDst,omitempty"`
	Service     string `json:"service,omitempty"` // destination service hostname
	MTLS        bool   `json:"mtls"`
	// BytesSent flowed from the accepting side (the client) upstream and
	// BytesReceived back, so far (the same live estimate the byte
	// counters are flushed from).
	BytesSent     int64 `json:"bytesSent"`
	BytesReceived int64 `json:"bytesReceived"`
}

// Connections returns the connections open now: those between Result.Opened
// and Result.Record (the set whose bytes are flushed while they run),
// oldest first. Connections that fail before they are established are not
// in it. The set is copied under its lock; the fields read are those Opened
// requires to be filled in before it is called, and the byte counts are
// atomic. Nil Metrics: none.
func (m *Metrics) Connections() []Connection {
	if m == nil {
		return nil
	}
	m.live.mu.Lock()
	rs := make([]*Result, 0, m.live.conns.len())
	for r := range m.live.conns.all() {
		rs = append(rs, r)
	}
	m.live.mu.Unlock()
	out := make([]Connection, 0, len(rs))
	for _, r := range rs {
		sent, recv := r.Counters.Live()
		c := Connection{
			Direction: r.Direction.String(), Start: r.Start,
			Src:     connPeer(r.SrcAddr.String(), r.Src),
			Dst:     connPeer(r.DstAddr.String(), r.Dst),
			Service: r.Service.Hostname, MTLS: r.MTLS, BytesSent: sent, BytesReceived: recv,
		}
		c.HBONEAddr = r.hboneAuthority()
		if r.OrigAddr.IsValid() && r.OrigAddr != r.DstAddr {
			c.OriginalDst = r.OrigAddr.String()
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Connection) int {
		return cmp.Or(a.Start.Compare(b.Start), cmp.Compare(a.Src.Addr, b.Src.Addr), cmp.Compare(a.Dst.Addr, b.Dst.Addr))
	})
	return out
}

func connPeer(addr string, p Peer) ConnPeer {
	cp := ConnPeer{Addr: addr, Workload: p.Workload, Namespace: p.Namespace}
	if !p.Identity.IsZero() {
		cp.Identity = p.Identity.String()
	}
	return cp
}
