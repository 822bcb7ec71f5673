package main

import (
	"fmt"
	"net/netip"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/proxy/route"
)

// inbound runs the destination node proxy's own acceptance of a CONNECT
// (route.Inbound, as its 15008 listener does) for authority, arriving at
// dw on nextHop from peer, adding its step; then, if accepted, its
// authorization of what the listener would dial (authorize). seen says
// which identity the node proxy sees.
func inbound(e *explanation, snap *state.Snapshot, dw *state.Workload, nextHop, authority netip.AddrPort, peer route.Peer, seen string) outcome {
	d, err := route.Inbound(snap, route.Arrival{Workload: dw, Addr: nextHop}, route.Authority{Addr: authority}, peer)
	if err != nil {
		e.add("inbound", "REFUSED: "+err.Error(), workloadRef(dw), "the node proxy on "+or(dw.Node, "-")+" refuses the CONNECT before authorization")
		e.Verdict = verdictRefused
		return outcome{verdict: verdictRefused, why: err.Error()}
	}
	detail := "the authority is the pod's own address"
	switch {
	case d.Waypoint:
		detail = "the pod is the waypoint of the authority"
	case dw.ApplicationTunnel != nil:
		detail = "the pod's application tunnel takes the authority and decides itself"
	}
	e.add("inbound", fmt.Sprintf("accepted: CONNECT %s, app at %s", authority, d.Upstream), workloadRef(dw), detail)
	return authorize(e, snap, dw, d.Conn, seen)
}
