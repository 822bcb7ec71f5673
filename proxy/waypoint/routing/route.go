// Package routing is the waypoint's router filter: HTTPRoute, GRPCRoute and
// VirtualService rules (router.go), the DestinationRule subsets and load
// balancing of their backends (lb.go) with outlier detection (outlier.go),
// circuit breaking (breaker.go), consistent hashing (hash.go) and locality
// (locality.go), VirtualService fault injection (fault.go) and request mirroring
// (mirror.go). It picks the endpoint a request goes to; the root package
// proxy/waypoint opens the connection and sends it.
package routing

import (
	"crypto/tls"
	"net/http"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/proxy/route"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// Router routes the requests of one waypoint. Its endpoint state
// (round-robin positions, outlier counters) outlives config pushes.
type Router struct {
	ip    netip.Addr
	rand  func(n uint64) uint64
	log   *zap.Logger
	pools pools
}

// New returns the router of the waypoint whose pod address is ip (the
// source its own routing decisions are made for). rnd returns a number in
// [0, n); log receives ejections and mirror failures.
func New(ip netip.Addr, rnd func(n uint64) uint64, log *zap.Logger) *Router {
	return &Router{ip: ip, rand: rnd, log: log}
}

// Result is where routing sends a request (or TCP stream).
type Result struct {
	// Rule is the route rule that matched (nil: none, or no routes).
	Rule *Rule
	// Edit is what the rule and the backend it picked do to the request
	// and its response (rewrite.go); when Edit.Answers, the rule answers
	// the request itself and nothing else of Result is set.
	Edit Edit
	// Target is the endpoint, or the authority an HBONE tunnel is opened
	// for; Via says how (route.Kind's name), for the access log.
	Target netip.AddrPort
	Via    string
	// Picked is the endpoint a DestinationRule policy chose: Done ends it.
	Picked *Picked
	// SetCookie is a Set-Cookie value to add to the response: the cookie
	// a consistent hash generated for a request without it ("": none).
	SetCookie string
	// DstWorkload is the workload routed to (nil: not a known workload);
	// DstName, DstNamespace and DstPrincipal (its SPIFFE URI) name it for
	// telemetry.
	DstWorkload                         *state.Workload
	DstName, DstNamespace, DstPrincipal string
	// TLS, when set, is the TLS the waypoint originates to Target
	// (DestinationRule tls SIMPLE or MUTUAL) inside whatever carries it.
	TLS *tls.Config
}

// Route picks the endpoint for a request to dst from client c (its
// verified peer namespace, which consumer routes are matched against, and
// its proven workload): through the service's routes
// (weighted backends) when table is not nil (HTTP to a bound service with
// routes) and one applies to the request, else the addressed service or
// workload itself. Result.Rule is set as soon as a rule matched, even when
// routing then fails. src is the client's address (a consistent hash's
// source IP). An error is a *stream.Refusal.
func (rt *Router) Route(snap *state.Snapshot, src, dst netip.AddrPort, table *Table, req *http.Request, c Client) (Result, error) {
	return rt.route(snap, src, dst, table, req, c, nil)
}

// Retry routes a retry of a request whose last attempt's Result had Edit
// prev. The rule and its weighted backend stay the ones prev matched and
// chose, and only the endpoint is picked again: Envoy picks a route's
// weighted cluster once per request and retries within it, so a 90/10
// split stays 90/10 however many attempts the backends' failures cost.
// (Picking the backend again moved the retries of a failing backend to the
// others.) A request no rule's backend routed is routed as the first time.
func (rt *Router) Retry(snap *state.Snapshot, src, dst netip.AddrPort, table *Table, req *http.Request, c Client, prev Edit) (Result, error) {
	return rt.route(snap, src, dst, table, req, c, &prev)
}

func (rt *Router) route(snap *state.Snapshot, src, dst netip.AddrPort, table *Table, req *http.Request, c Client, prev *Edit) (Result, error) {
	var res Result
	host, ns, port := "", "", dst.Port()
	var pol *backend // a backend with a DestinationRule policy
	retry := prev != nil && prev.backend != nil
	switch {
	case retry:
		// The rule the request matched, as it matched: its path may have
		// been rewritten since.
		res.Rule, res.Edit = prev.rule, *prev
	case table != nil:
		rule, m, routed := table.pick(req, c, dst.Port())
		res.Rule = rule
		switch {
		case !routed:
			table = nil // no route applies to this client or port
		case rule == nil:
			return res, &stream.Refusal{Code: http.StatusNotFound, Msg: "no HTTPRoute rule matches"}
		default:
			res.Edit = Edit{rule: rule, prefixLen: m.prefixLen}
			if rule.cors != nil {
				res.Edit.cors, res.Edit.origin = rule.cors.decide(req)
			}
			if res.Edit.Answers() {
				return res, nil
			}
		}
	}
	if retry || table != nil {
		b, ok := prev.backendOr(res.Rule, rt.rand)
		res.Edit.backend = b
		if !ok {
			return res, &stream.Refusal{Code: http.StatusInternalServerError, Msg: "route rule has no backend with weight"}
		}
		if b.refused != "" {
			// Gateway API: a request routed to an invalid backendRef gets 500.
			return res, &stream.Refusal{Code: http.StatusInternalServerError, Msg: "backend refused by the control plane: " + b.refused}
		}
		host, ns = b.hostname, b.namespace
		if b.port != 0 {
			port = b.port
		}
		if b.missingSubset != "" {
			return res, &stream.Refusal{Code: http.StatusServiceUnavailable, Msg: "subset " + b.missingSubset + " of " + b.hostname + " is not defined (DestinationRule)"}
		}
		if b.policy != nil {
			pol = b
		}
		if b.tlsErr != nil {
			return res, &stream.Refusal{Code: http.StatusServiceUnavailable, Msg: "TLS origination to " + b.hostname + ": " + b.tlsErr.Error()}
		}
		res.TLS = b.tls
	}
	var d route.Decision
	var err error
	if pol != nil {
		var key hashKey
		if hp := pol.policy.at(port).hash; hp != nil {
			key, res.SetCookie = hp.keyOf(req, src, dst)
		}
		d, res.Picked, err = rt.pickEndpoint(snap, pol, port, key)
	} else {
		d, err = rt.resolve(snap, dst, host, ns, port)
	}
	if err != nil {
		return res, err
	}
	if d.DstWorkload != nil {
		res.DstWorkload = d.DstWorkload
		res.DstName, res.DstNamespace = d.DstWorkload.Name, d.DstWorkload.Namespace
		if d.DstWorkload.WorkloadName != "" {
			res.DstName = d.DstWorkload.WorkloadName
		}
		res.DstPrincipal = d.UpstreamIdentity.String()
		if d.Kind == route.DoubleHBONE {
			res.DstPrincipal = d.FinalIdentity.String()
		}
	}
	res.Target = Target(d)
	if d.Kind == route.DoubleHBONE {
		// An endpoint behind a network gateway has no address to dial: the
		// waypoint dials the service (its address on this network), which
		// routes through the gateway again (route.Outbound), and the
		// gateway balances among the remote endpoints.
		t, ok := serviceAddr(snap, rt.ip, d.Service, d.Authority.Port())
		if !ok {
			return res, &stream.Refusal{Code: http.StatusServiceUnavailable,
				Msg: "service " + d.Service.Hostname + " has no address on the waypoint's network to reach its endpoints on network " + d.DstWorkload.Network}
		}
		res.Target = t
	}
	res.Via = d.Kind.String()
	return res, nil
}

// serviceAddr is svc's address on the network of the waypoint at ip, with
// port.
func serviceAddr(snap *state.Snapshot, ip netip.Addr, svc *state.Service, port uint16) (netip.AddrPort, bool) {
	network := ""
	if self := snap.WorkloadByIP("", ip); self != nil {
		network = self.Network
	}
	for _, v := range svc.VIPs {
		if v.Network == network && v.Prefix.IsSingleIP() {
			return netip.AddrPortFrom(v.Prefix.Addr(), port), true
		}
	}
	return netip.AddrPort{}, false
}

// resolve picks the endpoint for a backend service (host in namespace ns,
// at port; host "" means the addressed destination dst itself) with the
// same routing decision the node proxy makes.
func (rt *Router) resolve(snap *state.Snapshot, dst netip.AddrPort, host, ns string, port uint16) (route.Decision, error) {
	addr := dst
	if host != "" {
		s := snap.ServiceByNamespacedHostname(ns, host)
		if s == nil || len(s.VIPs) == 0 {
			return route.Decision{}, &stream.Refusal{Code: http.StatusServiceUnavailable, Msg: "backend " + host + " unknown or headless"}
		}
		addr = netip.AddrPortFrom(s.VIPs[0].Prefix.Addr(), port)
	}
	self := snap.WorkloadByIP("", rt.ip)
	d, err := route.OutboundWith(snap, self, addr, func(n int) int { return int(rt.rand(uint64(n))) })
	if err != nil {
		return route.Decision{}, &stream.Refusal{Code: http.StatusServiceUnavailable, Msg: err.Error()}
	}
	if d.Kind == route.Passthrough {
		return route.Decision{}, &stream.Refusal{Code: http.StatusServiceUnavailable, Msg: "destination " + addr.String() + " is not in the mesh"}
	}
	return d, nil
}

// Target is where a decision sends bytes: the endpoint, or for HBONE the
// authority the tunnel is opened for.
func Target(d route.Decision) netip.AddrPort {
	if d.Kind == route.HBONE {
		return d.Authority
	}
	return d.NextHop
}

// now is the clock of ejections (unix ns).
func (rt *Router) now() int64 { return time.Now().UnixNano() }
