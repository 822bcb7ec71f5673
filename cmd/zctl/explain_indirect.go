package main

import (
	"net/netip"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/proxy/route"
)

// indirectPath says that the source's direct connection to the destination
// workload (its pod IP, HBONE to its node proxy) and the way through the
// destination's waypoint are decided differently, and by what.
type indirectPath struct {
	// Direct and ViaWaypoint are the two verdicts; DirectBy and
	// ViaWaypointBy say what decided them (policy keys, or why none did).
	Direct        string `json:"direct"`
	DirectBy      string `json:"directBy"`
	ViaWaypoint   string `json:"viaWaypoint"`
	ViaWaypointBy string `json:"viaWaypointBy"`
	Waypoint      string `json:"waypoint"`
}

// flagIndirect, after a flow through a waypoint to dw (at target), asks
// what a direct connection from src to target would get: the same routing
// (route.OutboundWith; a workload that itself uses the waypoint has no
// direct path) and dw's node proxy seeing the client's identity.
func flagIndirect(e *explanation, snap *state.Snapshot, src, dw, wp *state.Workload, gw string, target netip.AddrPort, wo, node *outcome, rnd func(int) int) {
	rd, err := route.OutboundWith(snap, src, target, rnd)
	if err != nil || rd.Kind != route.HBONE || rd.Waypoint || rd.DstWorkload == nil || rd.DstWorkload.UID != dw.UID {
		return
	}
	applying := snap.PoliciesFor(dw)
	direct := l4Outcome(applying, rbac.Evaluate(applying, rbac.Conn{SrcIP: firstAddr(src), DstIP: rd.Authority.Addr(), DstPort: rd.Authority.Port(), SrcIdentity: src.Identity()}))
	compareIndirect(e, direct, rd.Authority, wp, gw, wo, node)
}

// viaWaypoint, after a direct flow from src to workload dw at authority,
// asks what the way through the waypoint of a service dw serves on that
// port would get (the service's VIP routed as the source node proxy
// routes it, the waypoint's authorization, dw's node proxy seeing the
// waypoint's identity). Istio ambient enforces a service waypoint's
// policies only for traffic addressed to the service.
func viaWaypoint(e *explanation, snap *state.Snapshot, req *request, src, dw *state.Workload, authority netip.AddrPort, direct outcome, rnd func(int) int) {
	for svc := range snap.Services() {
		if svc.Waypoint == nil || len(svc.VIPs) == 0 {
			continue
		}
		port := servicePortOf(snap, svc, dw, authority.Port())
		if port == 0 {
			continue
		}
		rv, err := route.OutboundWith(snap, src, netip.AddrPortFrom(svc.VIPs[0].Prefix.Addr(), port), rnd)
		if err != nil || !rv.Waypoint {
			continue
		}
		wp := rv.DstWorkload
		scratch := &explanation{}
		var wo *outcome
		gw := workloadRef(wp)
		if wd := req.waypointFor(wp); wd != nil {
			o := waypointAuthz(scratch, req, wd, src, rv.Authority, svc.Hostname)
			wo, gw = &o, gatewayRef(wd.raw)
		}
		var node *outcome
		if wo == nil || wo.verdict == verdictAllow {
			n := authorize(scratch, snap, dw, rbac.Conn{SrcIP: firstAddr(wp), DstIP: authority.Addr(), DstPort: authority.Port(), SrcIdentity: wp.Identity()}, "")
			node = &n
		}
		compareIndirect(e, direct, authority, wp, gw+" (for "+serviceRef(svc)+")", wo, node)
		return
	}
}

// servicePortOf returns svc's port that reaches dw on targetPort, 0 when dw
// is not its endpoint there.
func servicePortOf(snap *state.Snapshot, svc *state.Service, dw *state.Workload, targetPort uint16) uint16 {
	for _, ep := range snap.Endpoints(svc) {
		if ep.Workload == nil || ep.Workload.UID != dw.UID {
			continue
		}
		for _, pm := range ep.Ports {
			if pm.TargetPort == targetPort {
				return pm.ServicePort
			}
		}
	}
	return 0
}

// compareIndirect adds the indirect-path step when the direct verdict and
// the waypoint path's (the waypoint's, then the node proxy's) differ. A
// verdict that depends on the request, or a waypoint whose config is
// unknown that would have to allow, is not flagged.
func compareIndirect(e *explanation, direct outcome, at netip.AddrPort, wp *state.Workload, gw string, wo, node *outcome) {
	via := outcome{verdict: verdictAllow}
	var why []string
	if wo != nil {
		why = append(why, "waypoint: "+wo.why)
		via.policy = wo.policy
		if wo.verdict != verdictAllow {
			via.verdict = wo.verdict
		}
	}
	if via.verdict == verdictAllow && node != nil {
		why = append(why, "node proxy (as "+wp.Identity().String()+"): "+node.why)
		if node.verdict != verdictAllow || via.policy == "" {
			via.policy = node.policy
		}
		via.verdict = node.verdict
	}
	via.why = strings.Join(why, "; ")
	if direct.verdict == via.verdict || via.verdict == verdictDepends || via.verdict == verdictRefused ||
		(wo == nil && via.verdict == verdictAllow) {
		return
	}
	ip := &indirectPath{Direct: direct.verdict, DirectBy: direct.why, ViaWaypoint: via.verdict, ViaWaypointBy: via.why, Waypoint: gw}
	e.Indirect = ip
	result := "denied direct, allowed through the waypoint"
	if direct.verdict == verdictAllow {
		result = "allowed direct (bypassing the waypoint's policies), denied through the waypoint"
	}
	e.add("indirect path", result, deciders(direct)+" vs "+deciders(via),
		"direct to "+at.String()+" as the client: "+direct.why+"; through "+gw+": "+via.why)
}

// deciders names what decided o: its policy, or the ALLOW policies none of
// which matched.
func deciders(o outcome) string {
	if o.policy != "" {
		return policyRef(o.policy)
	}
	refs := make([]string, len(o.unmatched))
	for i, k := range o.unmatched {
		refs[i] = policyRef(k)
	}
	return or(strings.Join(refs, ", "), "-")
}
