package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/dnsproxy/resolve"
	"github.com/ztunnel-go/ztunnel-go/proxy/route"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// errDenied is returned when the connection would be denied or refused, so
// the exit status tells scripts.
var errDenied = errors.New("connection would be denied")

// Verdicts.
const (
	verdictAllow   = "ALLOW"   // a node proxy allowed it, or nothing enforces policy on it
	verdictDeny    = "DENY"    // an authorization policy (or its absence under ALLOW policies) denied it
	verdictRefused = "REFUSED" // the source node proxy has no route for it
)

// step is one decision along the flow, with the object that made it.
type step struct {
	Step   string `json:"step"`
	Result string `json:"result"`
	// By is the deciding object as kind/namespace/name.
	By     string `json:"by,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// explanation is what zctl explain prints, in every output format.
type explanation struct {
	// Proxy is where the state was read: an admin address or a file.
	Proxy       string `json:"proxy"`
	Source      string `json:"source"`
	Destination string `json:"destination"`
	Steps       []step `json:"steps"`
	Verdict     string `json:"verdict"`
	// Policy and Rule name what decided an enforced verdict (Rule is the
	// 0-based index of the matching rule); empty when no policy decided.
	Policy string `json:"policy,omitempty"`
	Rule   *int   `json:"rule,omitempty"`
	// Waypoints are the waypoint configs read (Gateway and where from).
	Waypoints []string `json:"waypoints,omitempty"`
	// Indirect is set when direct access and the way through a waypoint
	// are decided differently.
	Indirect *indirectPath `json:"indirect,omitempty"`
}

func (e *explanation) add(name, result, by, detail string) {
	e.Steps = append(e.Steps, step{Step: name, Result: result, By: by, Detail: detail})
}

// findSource finds the source workload by uid, "namespace/name" or IP.
func findSource(snap *state.Snapshot, d *dump, ref string) (*state.Workload, error) {
	if w := snap.WorkloadByUID(ref); w != nil {
		return w, nil
	}
	if ip, err := netip.ParseAddr(ref); err == nil {
		if w := snap.WorkloadByIP("", ip); w != nil {
			return w, nil
		}
		return nil, fmt.Errorf("no workload has IP %s", ip)
	}
	ns, name, ok := strings.Cut(ref, "/")
	var found []*state.Workload
	for _, w := range d.Workloads {
		if ok && w.Namespace == ns && w.Name == name {
			found = append(found, snap.WorkloadByUID(w.UID))
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return nil, fmt.Errorf("no workload %q (give a uid, namespace/name or IP)", ref)
	}
	return nil, fmt.Errorf("%d workloads are named %q; give the uid", len(found), ref)
}

func workloadRef(w *state.Workload) string { return "Workload/" + w.Namespace + "/" + w.Name }
func serviceRef(s *state.Service) string   { return "Service/" + s.Namespace + "/" + s.Name }
func policyRef(key string) string          { return "AuthorizationPolicy/" + key }

func firstAddr(w *state.Workload) netip.Addr {
	if len(w.Addresses) > 0 {
		return w.Addresses[0]
	}
	return netip.Addr{}
}

// explain follows src's connection to dst through the same functions the
// proxies run: route.OutboundWith at the source node proxy (with the
// service's load-balancing settings), the waypoint's own binding check and
// authorization (proxy/waypoint) when its config was given, and
// route.Inbound then rbac.Evaluate at the destination node proxy, each with
// the identity that enforcement point sees. It flags an indirect path (direct access and the
// way through the waypoint decided differently). rnd draws the endpoint
// (nil: random, as for a real connection).
func explain(d *dump, proxy, srcRef, dstArg string, req *request, rnd func(int) int) (*explanation, error) {
	if req == nil {
		req = &request{}
	}
	snap, err := d.snapshot()
	if err != nil {
		return nil, err
	}
	src, err := findSource(snap, d, srcRef)
	if err != nil {
		return nil, err
	}
	srcIP := firstAddr(src)
	id := src.Identity().String()
	if src.Protocol != state.TunnelHBONE {
		id = "no identity (not captured)"
	}
	e := &explanation{Proxy: proxy, Destination: dstArg, Source: fmt.Sprintf("%s/%s %s %s", src.Namespace, src.Name, srcIP, id)}
	for _, wd := range req.waypoints {
		e.Waypoints = append(e.Waypoints, gatewayRef(wd.raw)+" "+wd.from)
	}
	host := ""
	dst, err := netip.ParseAddrPort(dstArg)
	if err != nil {
		if dst, err = resolveDestination(e, snap, src, dstArg); err != nil {
			return nil, err
		}
		host, _, _ = net.SplitHostPort(dstArg)
	}

	if src.Protocol != state.TunnelHBONE {
		// Not captured: the pod's own stack sends plain TCP; the mesh routes
		// nothing and nothing proves its identity.
		e.add("capture", "off: "+src.Protocol.String()+" workload, plain TCP from the pod", workloadRef(src), "no node proxy captures its traffic, so it has no identity")
		return explainPlaintext(e, snap, src, dst, rnd)
	}
	e.add("capture", "on: outbound captured by the node proxy on "+or(src.Node, "-"), workloadRef(src), podState(d, src))
	r, err := route.OutboundWith(snap, src, dst, rnd)
	if err != nil {
		by, detail := "", err.Error()
		if svc := snap.ServiceByVIP(src.Network, dst.Addr(), src.Namespace); svc != nil {
			by = serviceRef(svc)
			detail += "; load balancing " + lbString(svc.LoadBalancing)
		}
		e.add("route", "refused at the source node proxy", by, detail)
		e.Verdict = verdictRefused
		return e, nil
	}
	by := ""
	if r.Service != nil {
		by = serviceRef(r.Service)
	}
	switch r.Kind {
	case route.Passthrough:
		e.add("route", "passthrough: plain TCP to "+r.NextHop.String(), by, "not a mesh destination; no node proxy authorizes it")
		e.Verdict = verdictAllow
		return e, nil
	case route.DoubleHBONE:
		// The rest happens on the other network: its gateway and node
		// proxy (or waypoint) decide with their own cluster's state.
		authority := r.AuthorityHost + ":" + strconv.Itoa(int(r.Authority.Port()))
		e.add("route", "double-hbone: CONNECT "+authority+" to network gateway "+r.NextHop.String(), by,
			"gateway "+workloadRef(r.Gateway)+" must be "+ids(r.UpstreamIdentities()))
		what := "endpoint"
		if r.Waypoint {
			what = "waypoint"
		}
		e.add(what, r.DstWorkload.Namespace+"/"+r.DstWorkload.Name+" on network "+r.DstWorkload.Network, workloadRef(r.DstWorkload),
			"inner CONNECT "+authority+" over mTLS inside the outer tunnel; peer must be "+ids(r.FinalIdentities()))
		e.add("authz", "on the other network: not known here", workloadRef(r.DstWorkload),
			"its node proxy evaluates its own policies")
		e.Verdict = verdictRemote
		return e, nil
	case route.Direct:
		e.add("route", "direct: plain TCP to "+r.NextHop.String(), by, "the destination does not use HBONE")
		e.add("endpoint", r.DstWorkload.Namespace+"/"+r.DstWorkload.Name+" "+r.NextHop.String(), workloadRef(r.DstWorkload), endpointWhy(r.Service))
		e.add("authz", "none: the destination is not captured by a node proxy", workloadRef(r.DstWorkload), "")
		e.Verdict = verdictAllow
		return e, nil
	}
	if r.Waypoint {
		if w := snap.WorkloadByIP(src.Network, dst.Addr()); by == "" && w != nil {
			by = workloadRef(w)
		}
		e.add("route", "waypoint: HBONE CONNECT "+r.Authority.String()+" to "+r.NextHop.String(), by,
			"peer must be "+ids(r.UpstreamIdentities()))
		return explainWaypoint(e, snap, req, src, r, dst, host, rnd)
	}
	dw := r.DstWorkload
	e.add("route", "hbone: CONNECT "+r.Authority.String()+" to "+r.NextHop.String(), or(by, workloadRef(dw)), "peer must be "+ids(r.UpstreamIdentities()))
	if r.Service != nil {
		e.add("endpoint", dw.Namespace+"/"+dw.Name+" "+r.Authority.String(), serviceRef(r.Service), endpointWhy(r.Service))
	}
	direct := inbound(e, snap, dw, r.NextHop, r.Authority, route.Peer{Addr: netip.AddrPortFrom(srcIP, 0), Identity: src.Identity()}, "the client's, over mTLS")
	if r.Service == nil {
		viaWaypoint(e, snap, req, src, dw, r.Authority, direct, rnd)
	}
	return e, nil
}

// explainWaypoint follows a connection routed to a waypoint: the waypoint's
// authorization as the client, its endpoint, then the endpoint's node proxy
// seeing the waypoint's identity.
func explainWaypoint(e *explanation, snap *state.Snapshot, req *request, src *state.Workload, r route.Decision, dst netip.AddrPort, host string, rnd func(int) int) (*explanation, error) {
	wp := r.DstWorkload
	// The endpoint the waypoint would go on to; the node proxy's endpoint
	// choice stands in for its load balancer.
	var dw *state.Workload
	target := dst
	var noEndpoint error
	if r.Service != nil {
		w, port, err := snap.SelectEndpoint(r.Service, dst.Port(), wp, rnd)
		if err != nil {
			noEndpoint = err
		} else {
			dw, target = w, netip.AddrPortFrom(firstAddr(w), port)
		}
	} else if dw = snap.WorkloadByIP(src.Network, dst.Addr()); dw == nil {
		return nil, fmt.Errorf("waypoint route to %s names no workload", dst)
	}
	wd := req.waypointFor(wp)
	var wo *outcome
	gw := workloadRef(wp)
	if wd == nil {
		why := "give --waypoint-admin or --waypoint-file"
		if len(req.waypoints) > 0 {
			why = fmt.Sprintf("none of the %d given runs as %s", len(req.waypoints), wp.Identity())
		}
		e.add("waypoint", wp.Namespace+"/"+wp.Name+" "+firstAddr(wp).String(), workloadRef(wp),
			"its L7 decision needs its config ("+why+"); it connects on with its own identity")
	} else {
		e.add("waypoint", wp.Namespace+"/"+wp.Name+" "+firstAddr(wp).String(), gatewayRef(wd.raw),
			"runs as "+wp.Identity().String()+": authorizes as the client, then connects on with its own identity")
		o := waypointAuthz(e, req, wd, src, r.Authority, host)
		wo, gw = &o, gatewayRef(wd.raw)
		if o.verdict == verdictDeny || o.verdict == verdictRefused {
			e.Verdict, e.Policy = o.verdict, o.policy
			if dw != nil {
				flagIndirect(e, snap, src, dw, wp, gw, target, wo, nil, rnd)
			}
			return e, nil
		}
	}
	if noEndpoint != nil {
		e.add("endpoint", "none for the waypoint", serviceRef(r.Service), noEndpoint.Error()+"; load balancing "+lbString(r.Service.LoadBalancing))
		e.Verdict = verdictRefused
		return e, nil
	}
	if r.Service != nil {
		e.add("endpoint", dw.Namespace+"/"+dw.Name+" "+target.String(), serviceRef(r.Service), endpointWhy(r.Service))
	}
	var node outcome
	if dw.Protocol == state.TunnelHBONE {
		// The waypoint opens HBONE to the endpoint's address on its 15008.
		node = inbound(e, snap, dw, netip.AddrPortFrom(target.Addr(), route.HBONEPort), target,
			route.Peer{Addr: netip.AddrPortFrom(firstAddr(wp), 0), Identity: wp.Identity()}, "the waypoint's, over mTLS")
	} else {
		node = authorize(e, snap, dw, rbac.Conn{SrcIP: firstAddr(wp), DstIP: target.Addr(), DstPort: target.Port(), SrcIdentity: wp.Identity()}, "the waypoint's, over mTLS")
	}
	if wo != nil && wo.verdict == verdictDepends && e.Verdict == verdictAllow {
		e.Verdict = verdictDepends
	}
	if wo != nil && wo.verdict == verdictAllow && e.Verdict == verdictAllow && e.Policy == "" {
		// The node proxy allows without a policy: the waypoint's ALLOW decided.
		e.Policy = wo.policy
	}
	flagIndirect(e, snap, src, dw, wp, gw, target, wo, &node, rnd)
	return e, nil
}

// resolveDestination answers host:port's host as src's DNS proxy would (the
// resolve package the DNS server runs), adding the dns step.
func resolveDestination(e *explanation, snap *state.Snapshot, src *state.Workload, hostPort string) (netip.AddrPort, error) {
	host, portStr, err := net.SplitHostPort(hostPort)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("destination %q: want ip:port or host:port: %w", hostPort, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("destination %q: port: %w", hostPort, err)
	}
	var r resolve.Resolver // the node's defaults: cluster.local, no preferred namespace
	ans := r.Resolve(snap, src, host, dns.TypeA)
	qtype := "A"
	if ans.Found && len(ans.Addrs) == 0 {
		if six := r.Resolve(snap, src, host, dns.TypeAAAA); len(six.Addrs) > 0 {
			ans, qtype = six, "AAAA"
		}
	}
	if !ans.Found {
		return netip.AddrPort{}, fmt.Errorf("dns: %s is not a mesh name for %s/%s: its DNS proxy forwards the query upstream, whose answer zctl cannot know; give ip:port", host, src.Namespace, src.Name)
	}
	if len(ans.Addrs) == 0 {
		return netip.AddrPort{}, fmt.Errorf("dns: %s (%s) is a mesh name with no address for %s/%s (the DNS proxy answers no records); give ip:port", host, serviceRef(ans.Service), src.Namespace, src.Name)
	}
	var chain []string
	for _, c := range ans.CNAMEs {
		chain = append(chain, "CNAME "+strings.TrimSuffix(c.Name, ".")+" → "+strings.TrimSuffix(c.Target, "."))
	}
	kind := "Service"
	if !strings.HasSuffix(ans.Service.Hostname, ".svc."+resolve.DefaultClusterDomain) {
		kind = "ServiceEntry"
	}
	detail := "answered by the pod's DNS proxy (if its DNS is captured: not in this dump)"
	if len(chain) > 0 {
		detail += "; " + strings.Join(chain, ", ")
	}
	if kind == "ServiceEntry" {
		detail += "; the ServiceEntry's address"
	}
	e.add("dns", fmt.Sprintf("%s %s → %s", qtype, host, ans.Addrs[0]), kind+"/"+ans.Service.Namespace+"/"+ans.Service.Name, detail)
	return netip.AddrPortFrom(ans.Addrs[0], uint16(port)), nil
}

// explainPlaintext follows an uncaptured source: kube-proxy (or the pod)
// picks the endpoint, and a captured destination's node proxy sees a
// plaintext connection on its inbound port, without identity.
func explainPlaintext(e *explanation, snap *state.Snapshot, src *state.Workload, dst netip.AddrPort, rnd func(int) int) (*explanation, error) {
	dw, target := (*state.Workload)(nil), dst
	if svc := snap.ServiceByVIP(src.Network, dst.Addr(), src.Namespace); svc != nil {
		w, port, err := snap.SelectEndpoint(svc, dst.Port(), src, rnd)
		if err != nil {
			e.add("endpoint", "none", serviceRef(svc), err.Error()+"; load balancing "+lbString(svc.LoadBalancing))
			e.Verdict = verdictRefused
			return e, nil
		}
		dw, target = w, netip.AddrPortFrom(firstAddr(w), port)
		e.add("endpoint", w.Namespace+"/"+w.Name+" "+target.String(), serviceRef(svc), "kube-proxy picks among the same endpoints; "+endpointWhy(svc))
	} else if dw = snap.WorkloadByIP(src.Network, dst.Addr()); dw == nil {
		e.add("route", "plain TCP to "+dst.String(), "", "not a mesh destination")
		e.Verdict = verdictAllow
		return e, nil
	}
	if dw.Protocol != state.TunnelHBONE {
		e.add("authz", "none: the destination is not captured by a node proxy", workloadRef(dw), "")
		e.Verdict = verdictAllow
		return e, nil
	}
	authorize(e, snap, dw, rbac.Conn{SrcIP: firstAddr(src), DstIP: target.Addr(), DstPort: target.Port()}, "plaintext on the inbound port")
	return e, nil
}

// authorize runs the destination node proxy's L4 authorization and sets the
// verdict, naming the deciding policy and rule.
func authorize(e *explanation, snap *state.Snapshot, dw *state.Workload, conn rbac.Conn, seen string) outcome {
	applying := snap.PoliciesFor(dw)
	dec := rbac.Evaluate(applying, conn)
	peer := "no identity"
	if !conn.SrcIdentity.IsZero() {
		peer = conn.SrcIdentity.String()
	}
	peer += " (" + seen + ")"
	keys := make([]string, len(applying))
	for i, p := range applying {
		keys[i] = p.Key
	}
	e.add("policies", or(strings.Join(keys, ", "), "none"), workloadRef(dw), "applying at the node proxy on "+or(dw.Node, "-"))
	o := l4Outcome(applying, dec)
	by, detail := "", fmt.Sprintf("sees %s from %s to %s", peer, conn.SrcIP, netip.AddrPortFrom(conn.DstIP, conn.DstPort))
	if dec.Policy != "" {
		by = policyRef(dec.Policy)
		e.Policy = dec.Policy
		for _, p := range applying {
			if i, ok := matchingRule(p, conn); ok && p.Key == dec.Policy {
				e.Rule = &i
				detail = fmt.Sprintf("rule %d; %s", i, detail)
			}
		}
	}
	e.add("authz", o.verdict+" ("+dec.Reason.String()+")", by, detail)
	if v, ok := dec.DryRun(); ok && v.Differs {
		what := "would deny"
		if v.Allowed {
			what = "would allow"
		}
		e.add("dry-run", what, policyRef(v.Policy), "dry-run policies are never enforced")
	}
	if dec.Audited != "" {
		e.add("audit", "audited", policyRef(dec.Audited), "")
	}
	e.Verdict = o.verdict
	return o
}

// outcome is one enforcement point's decision: the verdict, the deciding
// policy's key ("" when none decided) and why, in words.
type outcome struct {
	verdict, policy, why string
	// unmatched are the ALLOW policies none of which matched, when that
	// denied (no single policy decided).
	unmatched []string
}

// l4Outcome describes a node proxy's rbac decision.
func l4Outcome(applying []*rbac.Policy, dec rbac.Decision) outcome {
	o := outcome{verdict: verdictAllow, policy: dec.Policy}
	if !dec.Allowed {
		o.verdict = verdictDeny
	}
	switch {
	case dec.Policy != "" && dec.Allowed:
		o.why = "allowed by " + dec.Policy
	case dec.Policy != "":
		o.why = "denied by " + dec.Policy
	case dec.Reason == rbac.ReasonNoAllowMatched:
		var allows []string
		for _, p := range applying {
			if p.Action == rbac.Allow && !p.DryRun {
				allows = append(allows, p.Key)
			}
		}
		o.why, o.unmatched = "no ALLOW policy matched ("+strings.Join(allows, ", ")+")", allows
	default:
		o.why = dec.Reason.String()
	}
	return o
}

// matchingRule returns the index of the first rule of p that conn matches,
// asking rbac itself with p narrowed to that one rule.
func matchingRule(p *rbac.Policy, conn rbac.Conn) (int, bool) {
	for i, r := range p.Rules {
		one := *p
		one.Rules = []rbac.Rule{r}
		if one.Matches(conn) {
			return i, true
		}
	}
	return 0, false
}

func ids(in []identity.Identity) string {
	s := make([]string, len(in))
	for i, id := range in {
		s[i] = id.String()
	}
	return or(strings.Join(s, " or "), "-")
}

// lbString describes a service's load-balancing settings as the proxy
// applies them (internalTrafficPolicy: Local arrives as STRICT on NODE).
func lbString(lb *state.LoadBalancing) string {
	if lb == nil {
		return "default (weighted random over healthy endpoints)"
	}
	prefs := make([]string, len(lb.RoutingPreference))
	for i, p := range lb.RoutingPreference {
		prefs[i] = p.String()
	}
	s := lb.Mode.String()
	if len(prefs) > 0 {
		s += " on " + strings.Join(prefs, ",")
	}
	if lb.Mode == state.LBModeStrict && len(prefs) == 1 && lb.RoutingPreference[0] == state.ScopeNode {
		s += " (internalTrafficPolicy: Local)"
	}
	return s + ", health " + lb.HealthPolicy.String()
}

func endpointWhy(svc *state.Service) string {
	if svc == nil {
		return "the workload addressed"
	}
	return "load balancing " + lbString(svc.LoadBalancing)
}

// podState reports the source pod's in-pod proxy from the dump's
// workloadState, when this node proxy runs it.
func podState(d *dump, w *state.Workload) string {
	if d.WorkloadState == nil {
		return "this dump has no workload state"
	}
	for _, p := range d.WorkloadState {
		if p.Info.Namespace == w.Namespace && p.Info.Name == w.Name {
			s := "in-pod proxy " + p.State
			if p.Since != "" {
				s += " since " + p.Since
			}
			if p.LastError != "" {
				s += ": " + p.LastError
			}
			return s
		}
	}
	return "this node proxy does not run its in-pod proxy (another node's dump knows it)"
}
