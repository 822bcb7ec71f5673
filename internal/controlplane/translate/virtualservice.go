package translate

import (
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// Istio's own routing objects at a waypoint (issue 14).
//
// A VirtualService whose hosts name a service bound to a waypoint becomes
// one waypointapi.Route of kind "VirtualService" on that service: its http
// rules in order, evaluated first match first as Istio does (not by Gateway
// API specificity). Several VirtualServices for one host are concatenated,
// oldest first, then by namespace/name. A VirtualService whose gateways do
// not include "mesh" is for gateways, not for a waypoint.
//
// Precedence: Istio leaves mixing Gateway API routes and VirtualServices
// for one service undefined. Here an HTTPRoute or GRPCRoute attached to the
// service wins and its VirtualServices are not applied; the VirtualService's
// status says which route displaced it.
//
// DestinationRules are looked up for every backend host as Istio looks
// them up for a client: first in the waypoint's namespace, then the host's,
// then the root namespace; an exact host before a wildcard, then the oldest.
// Rules with a workloadSelector configure sidecars of selected workloads and
// are not applied. A backend's subset becomes its labels and the uids of
// the host's workloads whose labels match (the workload API carries no
// labels); a subset that is referenced but not defined is marked
// missing_subset (the waypoint answers 503, as Istio does). The traffic
// policy (the subset's fields over the rule's) is applied to VirtualService
// and Gateway API backends alike; a service with no route at all but a
// DestinationRule traffic policy gets a catch-all route of kind
// "DestinationRule" to itself, so the policy applies there too.
//
// Fail closed: a match condition or field the waypoint cannot enforce makes
// the rule holding it answer 500 (no backends), as an unsupported HTTPRoute
// filter does, and is listed in the object's status (PolicyStatus.Invalid:
// logged once and shown in the config dump). Retry conditions the waypoint
// does not evaluate are dropped (it retries less, never more) and named in
// the status message. The name and statPrefix fields only name things and
// are accepted. exportTo (else meshConfig's defaultVirtualServiceExportTo /
// defaultDestinationRuleExportTo, else "*") is evaluated for the waypoint's
// namespace, the namespace of the proxy that applies them, as Istio does
// for any proxy: a VirtualService exported to "." in namespace team-a is
// not applied by a waypoint in namespace shared. An invalid exportTo
// narrows to the object's own namespace.

const (
	kindVS = "VirtualService"
	kindDR = "DestinationRule"
)

// istioRouting converts VirtualServices and DestinationRules for the
// waypoints of one WaypointConfigs call and records what became of each.
type istioRouting struct {
	t   *translator
	res *Result
	// endpoints: "ns/hostname" → workloads of that service (built once).
	endpoints map[string][]*workloadapi.Workload
	vs, dr    map[string]*istioStatus // by ns/name
	// vsByName: every VirtualService by ns/name (built on first use, for
	// delegates); clients: workload uids by sourceLabels selector
	// (selectorKey), built on first use.
	vsByName map[string]*networkingv1.VirtualService
	clients  map[string][]string
	// pods: every pod by ns/name, built on first use (workloadLabels):
	// waypoint configs index no pods otherwise.
	pods map[string]*corev1.Pod
}

// istioStatus is what became of one VirtualService or DestinationRule.
type istioStatus struct {
	waypoints []string
	services  []string
	displaced []string // routes that took precedence
	invalid   []string
	notes     []string
	// gatewaysOnly: the VirtualService's gateways, when "mesh" is not
	// among them (it is for gateway proxies only).
	gatewaysOnly []string
}

// NotForMesh begins the status of a VirtualService bound to gateways only:
// it configures gateway proxies (an ingress gateway's Envoy), which
// ztunnel-go does not run or configure, so it is not applicable here
// rather than wrong.
const NotForMesh = "not for the mesh: "

func newIstioRouting(t *translator, res *Result) *istioRouting {
	ir := &istioRouting{t: t, res: res, vs: map[string]*istioStatus{}, dr: map[string]*istioStatus{}}
	for _, v := range t.objs.VirtualServices {
		st := &istioStatus{}
		for _, p := range ValidateVirtualService(v) {
			st.addInvalid(p)
		}
		if !appliesToMesh(v.Spec.GetGateways()) {
			st.gatewaysOnly = v.Spec.GetGateways()
		}
		ir.vs[v.Namespace+"/"+v.Name] = st
	}
	for _, d := range t.objs.DestinationRules {
		st := &istioStatus{}
		for _, p := range validateDR(d) {
			st.addInvalid(p)
		}
		ir.dr[d.Namespace+"/"+d.Name] = st
	}
	return ir
}

func (st *istioStatus) addInvalid(p string) {
	if !slices.Contains(st.invalid, p) {
		st.invalid = append(st.invalid, p)
	}
}

func (st *istioStatus) addNote(n string) {
	if !slices.Contains(st.notes, n) {
		st.notes = append(st.notes, n)
	}
}

func (st *istioStatus) attach(wp, svc string) {
	if !slices.Contains(st.waypoints, wp) {
		st.waypoints = append(st.waypoints, wp)
	}
	if !slices.Contains(st.services, svc) {
		st.services = append(st.services, svc)
	}
}

// resolveIstioHost is Istio's short-name rule: a host without a dot is a
// Kubernetes service in the object's namespace.
func (t *translator) resolveIstioHost(host, ns string) string {
	if host == "*" || strings.Contains(host, ".") {
		return host
	}
	return host + "." + ns + ".svc." + t.cfg.DomainSuffix
}

// hostMatches: pattern is a resolved host, "*", or "*.suffix".
func hostMatches(pattern, host string) bool {
	if pattern == host || pattern == "*" {
		return true
	}
	return strings.HasPrefix(pattern, "*.") && strings.HasSuffix(host, pattern[1:])
}

// hostNamespace is the namespace of a Kubernetes service hostname, else def.
func (t *translator) hostNamespace(host, def string) string {
	if rest, ok := strings.CutSuffix(host, ".svc."+t.cfg.DomainSuffix); ok {
		if _, ns, ok := strings.Cut(rest, "."); ok && !strings.Contains(ns, ".") {
			return ns
		}
	}
	return def
}

func appliesToMesh(gateways []string) bool {
	return len(gateways) == 0 || slices.Contains(gateways, "mesh")
}

// routes returns the routes of service s (bound to waypoint wp, ns/name):
// the Gateway API routes when there are any, else its VirtualServices, else
// a DestinationRule catch-all; every backend gets its DestinationRule.
func (ir *istioRouting) routes(wp string, s *workloadapi.Service, gw []*waypointapi.Route) []*waypointapi.Route {
	svcKey := s.GetNamespace() + "/" + s.GetHostname()
	wpNs, _, _ := strings.Cut(wp, "/")
	vss := ir.virtualServicesFor(s.GetHostname(), wpNs)
	out := gw
	switch {
	case len(gw) > 0:
		var names []string
		for _, r := range gw {
			names = append(names, r.GetKind()+" "+r.GetNamespace()+"/"+r.GetName())
		}
		for _, v := range vss {
			st := ir.vs[v.Namespace+"/"+v.Name]
			for _, n := range names {
				if !slices.Contains(st.displaced, n+" on "+svcKey) {
					st.displaced = append(st.displaced, n+" on "+svcKey)
				}
			}
		}
	case len(vss) > 0:
		for _, v := range vss {
			st := ir.vs[v.Namespace+"/"+v.Name]
			st.attach(wp, svcKey)
			out = append(out, ir.convertVS(v, st, wp, svcKey))
		}
	}
	for _, r := range out {
		for _, rr := range r.GetRules() {
			ok := true
			for _, b := range rr.GetBackends() {
				ok = ir.applyDR(wpNs, wp, svcKey, b) && ok
			}
			for _, m := range rr.GetMirrors() {
				ir.applyDR(wpNs, wp, svcKey, m.GetBackend())
			}
			if !ok {
				rr.Backends = nil // a traffic policy it cannot enforce: 500
			}
		}
	}
	if d := ir.destinationRuleFor(wpNs, s.GetNamespace(), s.GetHostname()); d != nil {
		// The service's own rule applies here even when nothing routes to
		// one of its subsets.
		ir.dr[d.Namespace+"/"+d.Name].attach(wp, svcKey)
	}
	if len(out) == 0 {
		if d := ir.destinationRuleFor(wpNs, s.GetNamespace(), s.GetHostname()); d != nil && d.Spec.GetTrafficPolicy() != nil {
			// One catch-all for every port, or, when the rule sets tls per
			// port, one per service port (scoped to it) with that port's.
			ports := []uint32{0}
			if hasPortTLS(d.Spec.GetTrafficPolicy()) {
				ports = ports[:0]
				for _, p := range s.GetPorts() {
					ports = append(ports, p.GetServicePort())
				}
			}
			for _, port := range ports {
				be := &waypointapi.Backend{Hostname: s.GetHostname(), Namespace: s.GetNamespace(), Weight: 1, Port: port}
				rr := &waypointapi.RouteRule{Backends: []*waypointapi.Backend{be}}
				if !ir.applyDR(wpNs, wp, svcKey, be) {
					rr.Backends = nil
				}
				r := &waypointapi.Route{Name: d.Name, Namespace: d.Namespace, Kind: kindDR, Rules: []*waypointapi.RouteRule{rr}}
				if port != 0 {
					r.Ports = []uint32{port}
				}
				out = append(out, r)
			}
		}
	}
	return out
}

// virtualServicesFor returns the VirtualServices for the mesh whose hosts
// name hostname and that are exported to namespace proxyNs, oldest first,
// then by namespace/name.
func (ir *istioRouting) virtualServicesFor(hostname, proxyNs string) []*networkingv1.VirtualService {
	var out []*networkingv1.VirtualService
	for _, v := range ir.t.objs.VirtualServices {
		if !appliesToMesh(v.Spec.GetGateways()) {
			continue
		}
		if e, _ := parseExportTo(v.Spec.GetExportTo(), ir.t.cfg.DefaultVirtualServiceExportTo, v.Namespace, "spec.exportTo"); !e.visibleTo(proxyNs) {
			continue
		}
		for _, h := range v.Spec.GetHosts() {
			if hostMatches(ir.t.resolveIstioHost(h, v.Namespace), hostname) {
				out = append(out, v)
				break
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return olderMeta(&out[i].ObjectMeta, &out[j].ObjectMeta) })
	return out
}

// convertVS turns a VirtualService's http rules into a Route (a rule that
// delegates becomes its delegate's rules, delegate.go); wp and svcKey say
// where it is applied.
func (ir *istioRouting) convertVS(v *networkingv1.VirtualService, st *istioStatus, wp, svcKey string) *waypointapi.Route {
	wr := &waypointapi.Route{Name: v.Name, Namespace: v.Namespace, Kind: kindVS}
	var bad problems
	for i := range v.Spec.GetTcp() {
		bad.addf(fieldAt("spec.tcp", i), "TCP routes are not supported by ztunnel-go's waypoint; TCP goes to the addressed service")
	}
	for i := range v.Spec.GetTls() {
		bad.addf(fieldAt("spec.tls", i), "TLS routes are not supported by ztunnel-go's waypoint; TLS goes to the addressed service")
	}
	for i, h := range v.Spec.GetHttp() {
		path := fieldAt("spec.http", i)
		if h.GetDelegate() == nil {
			if rr, ok := ir.convertHTTPRoute(path, v.Namespace, h, &bad, st); ok {
				wr.Rules = append(wr.Rules, rr)
			}
			continue
		}
		for _, d := range ir.convertDelegating(path, v, h, wp, svcKey, &bad, st) {
			var rr *waypointapi.RouteRule
			ok := false
			if d.fail {
				rr, ok = ir.failClosedRule(d.path, d.rule, &bad)
			} else {
				rr, ok = ir.convertHTTPRoute(d.path, d.ns, d.rule, &bad, st)
			}
			if ok {
				wr.Rules = append(wr.Rules, rr)
			}
		}
	}
	for _, p := range bad {
		st.addInvalid(p)
	}
	return wr
}

// failClosedRule is a rule with h's mesh matches that answers them 500;
// ok is false when none of its matches applies to mesh traffic.
func (ir *istioRouting) failClosedRule(path string, h *networkingv1alpha3.HTTPRoute, bad *problems) (*waypointapi.RouteRule, bool) {
	rr := &waypointapi.RouteRule{}
	for i, m := range h.GetMatch() {
		if appliesToMesh(m.GetGateways()) {
			rr.Matches = append(rr.Matches, ir.convertVSMatch(fieldAt(path+".match", i), m, bad))
		}
	}
	return rr, len(h.GetMatch()) == 0 || len(rr.Matches) > 0
}

// convertHTTPRoute converts one http rule; ok is false when none of its
// matches applies to mesh traffic (they name gateways only).
func (ir *istioRouting) convertHTTPRoute(path, ns string, h *networkingv1alpha3.HTTPRoute, bad *problems, st *istioStatus) (*waypointapi.RouteRule, bool) {
	rr := &waypointapi.RouteRule{}
	before := len(*bad)
	for i, m := range h.GetMatch() {
		if !appliesToMesh(m.GetGateways()) {
			continue
		}
		rr.Matches = append(rr.Matches, ir.convertVSMatch(fieldAt(path+".match", i), m, bad))
	}
	if len(h.GetMatch()) > 0 && len(rr.Matches) == 0 {
		return nil, false
	}
	for _, d := range h.GetRoute() {
		weight := uint32(max(d.GetWeight(), 0))
		if len(h.GetRoute()) == 1 {
			weight = 1
		}
		be := ir.vsBackend(ns, d.GetDestination(), weight)
		if hd := d.GetHeaders(); hd != nil {
			// Per destination: only for requests sent to it.
			if m := istioHeaderOps(hd.GetRequest()); m != nil {
				be.RequestHeaderModifiers = []*waypointapi.HeaderModifier{m}
			}
			if m := istioHeaderOps(hd.GetResponse()); m != nil {
				be.ResponseHeaderModifiers = []*waypointapi.HeaderModifier{m}
			}
		}
		rr.Backends = append(rr.Backends, be)
	}
	if len(h.GetRoute()) > 1 && !slices.ContainsFunc(rr.Backends, func(b *waypointapi.Backend) bool { return b.Weight > 0 }) {
		for _, b := range rr.Backends {
			b.Weight = 1
		}
	}
	rr.Cors = convertVSCors(path+".corsPolicy", h.GetCorsPolicy(), bad)
	if len(h.GetRoute()) == 0 && h.GetRedirect() == nil && h.GetDirectResponse() == nil {
		bad.addf(path+".route", "a rule without destinations routes nowhere; requests it matches answer 500")
	}
	if hd := h.GetHeaders(); hd != nil {
		if m := istioHeaderOps(hd.GetRequest()); m != nil {
			rr.RequestHeaderModifiers = append(rr.RequestHeaderModifiers, m)
		}
		if m := istioHeaderOps(hd.GetResponse()); m != nil {
			rr.ResponseHeaderModifiers = append(rr.ResponseHeaderModifiers, m)
		}
	}
	rr.Rewrite = convertVSRewrite(path+".rewrite", h.GetRewrite(), bad)
	rr.Redirect = convertVSRedirect(path+".redirect", h.GetRedirect(), bad)
	if d := h.GetDirectResponse(); d != nil && rr.Redirect == nil {
		if d.GetStatus() < 200 || d.GetStatus() > 599 {
			bad.addf(path+".directResponse.status", "%d is not an HTTP status; requests this rule matches answer 500", d.GetStatus())
		}
		body := d.GetBody().GetBytes()
		if s := d.GetBody().GetString_(); s != "" {
			body = []byte(s)
		}
		rr.DirectResponse = &waypointapi.DirectResponse{Status: d.GetStatus(), Body: body}
	}
	if rr.Redirect != nil || rr.DirectResponse != nil {
		// The rule answers itself (Envoy's redirect and direct_response
		// route actions): no destination, no mirror.
		rr.Backends, rr.Mirrors = nil, nil
	}
	if rr.Rewrite.GetPath().GetType() == waypointapi.PathModifier_STRING_PREFIX || rr.Redirect.GetPath().GetType() == waypointapi.PathModifier_STRING_PREFIX {
		// Envoy matches a rule without a uri match as the prefix "/", and
		// a prefix rewrite replaces that "/".
		for _, m := range rr.Matches {
			if m.Path == nil {
				m.Path = &waypointapi.PathMatch{Type: waypointapi.PathMatch_STRING_PREFIX, Value: "/"}
			}
		}
		if len(rr.Matches) == 0 {
			rr.Matches = []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_STRING_PREFIX, Value: "/"}}}
		}
	}
	if ms, ok := durationMs(h.GetTimeout()); ok {
		rr.TimeoutMs = ms
	}
	rr.Retry = convertVSRetry(path+".retries", h.GetRetries(), st)
	rr.Fault = convertFault(path+".fault", h.GetFault(), bad)
	if m := h.GetMirror(); m != nil {
		pct := 100.0
		if p := h.GetMirrorPercentage(); p != nil {
			pct = p.GetValue()
		} else if p := h.GetMirrorPercent(); p != nil {
			pct = float64(p.GetValue())
		}
		rr.Mirrors = append(rr.Mirrors, ir.vsMirror(ns, m, pct))
	}
	for _, m := range h.GetMirrors() {
		pct := 100.0
		if p := m.GetPercentage(); p != nil {
			pct = p.GetValue()
		}
		rr.Mirrors = append(rr.Mirrors, ir.vsMirror(ns, m.GetDestination(), pct))
	}
	if len(*bad) > before {
		// fail closed: 500 for what it matches
		rr.Backends, rr.Redirect, rr.DirectResponse = nil, nil, nil
	}
	return rr, true
}

func (ir *istioRouting) vsBackend(ns string, d *networkingv1alpha3.Destination, weight uint32) *waypointapi.Backend {
	host := ir.t.resolveIstioHost(d.GetHost(), ns)
	return &waypointapi.Backend{
		Hostname: host, Namespace: ir.t.hostNamespace(host, ns), Port: d.GetPort().GetNumber(),
		Weight: weight, Subset: d.GetSubset(),
	}
}

func (ir *istioRouting) vsMirror(ns string, d *networkingv1alpha3.Destination, pct float64) *waypointapi.Mirror {
	b := ir.vsBackend(ns, d, 0)
	p := uint32(min(max(math.Ceil(pct), 0), 100))
	return &waypointapi.Mirror{Backend: b, Percent: p}
}

// convertVSMatch converts one HTTPMatchRequest. Conditions that cannot be
// evaluated are left out of the match (which then matches more) and
// reported; the caller makes the rule answer 500.
//
// sourceNamespace and sourceLabels are about the client, which the
// waypoint knows better than a sidecar's route table does: its namespace
// from its peer certificate, its workload from its address in the workload
// API (with that certificate's identity). sourceLabels become the uids of
// the workloads they select, in any namespace, as Istio's sourceLabels
// select client proxies in any namespace; none selected matches no client.
// Istio's own waypoint drops matches with sourceLabels and compares
// sourceNamespace with the waypoint's namespace (istio/istio#51565);
// ztunnel-go matches the client, as the field is documented.
func (ir *istioRouting) convertVSMatch(path string, m *networkingv1alpha3.HTTPMatchRequest, bad *problems) *waypointapi.RouteMatch {
	rm := &waypointapi.RouteMatch{}
	if u := m.GetUri(); u != nil {
		fold := ""
		if m.GetIgnoreUriCase() {
			fold = "(?i)"
		}
		switch v := u.GetMatchType().(type) {
		case *networkingv1alpha3.StringMatch_Exact:
			if fold == "" {
				rm.Path = &waypointapi.PathMatch{Type: waypointapi.PathMatch_EXACT, Value: v.Exact}
			} else {
				rm.Path = &waypointapi.PathMatch{Type: waypointapi.PathMatch_REGULAR_EXPRESSION, Value: fold + regexp.QuoteMeta(v.Exact)}
			}
		case *networkingv1alpha3.StringMatch_Prefix:
			// Istio's prefix is a string prefix ("/api" matches "/apix").
			rm.Path = &waypointapi.PathMatch{Type: waypointapi.PathMatch_STRING_PREFIX, Value: v.Prefix, IgnoreCase: fold != ""}
		case *networkingv1alpha3.StringMatch_Regex:
			rm.Path = &waypointapi.PathMatch{Type: waypointapi.PathMatch_REGULAR_EXPRESSION, Value: fold + "(?:" + v.Regex + ")"}
		}
		if rm.Path != nil && rm.Path.Type == waypointapi.PathMatch_REGULAR_EXPRESSION {
			if _, err := regexp.Compile(rm.Path.Value); err != nil {
				bad.addf(path+".uri", "not an RE2 expression: %v", err)
			}
		}
	}
	if meth := m.GetMethod(); meth != nil {
		if e, ok := meth.GetMatchType().(*networkingv1alpha3.StringMatch_Exact); ok {
			rm.Method = e.Exact
		} else {
			bad.addf(path+".method", "only an exact method match is supported by ztunnel-go's waypoint; requests this rule matches answer 500")
		}
	}
	if a := m.GetAuthority(); a != nil {
		rm.Headers = append(rm.Headers, istioHeaderMatch(path+".authority", "host", a, bad))
	}
	for _, k := range sortedKeys(m.GetHeaders()) {
		rm.Headers = append(rm.Headers, istioHeaderMatch(path+".headers["+k+"]", k, m.GetHeaders()[k], bad))
	}
	for _, k := range sortedKeys(m.GetQueryParams()) {
		rm.QueryParams = append(rm.QueryParams, istioHeaderMatch(path+".queryParams["+k+"]", k, m.GetQueryParams()[k], bad))
	}
	unsupported := func(field string, set bool) {
		if set {
			bad.addf(path+"."+field, "not supported by ztunnel-go's waypoint; requests this rule matches answer 500")
		}
	}
	unsupported("scheme", m.GetScheme() != nil)
	rm.Port = m.GetPort()
	if sl := m.GetSourceLabels(); len(sl) > 0 {
		for _, k := range sortedKeys(sl) {
			if e := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(sl[k])...); len(e) > 0 {
				bad.addf(path+".sourceLabels["+k+"]", "not a label: %s; requests this rule matches answer 500", strings.Join(e, "; "))
			}
		}
		rm.SourceWorkloads = &waypointapi.SourceWorkloads{Labels: sl, Uids: ir.clientsWithLabels(sl)}
	}
	if ns := m.GetSourceNamespace(); ns != "" {
		if len(validation.IsDNS1123Label(ns)) > 0 {
			bad.addf(path+".sourceNamespace", "%q is not a namespace name; requests this rule matches answer 500", ns)
		}
		rm.SourceNamespace = ns
	}
	unsupported("withoutHeaders", len(m.GetWithoutHeaders()) > 0)
	return rm
}

// istioHeaderMatch: exact stays exact; prefix and regex become RE2, which
// the waypoint matches against the whole value (Istio's regex is a full
// match); an empty match is presence.
func istioHeaderMatch(path, name string, sm *networkingv1alpha3.StringMatch, bad *problems) *waypointapi.HeaderMatch {
	hm := &waypointapi.HeaderMatch{Name: name}
	switch v := sm.GetMatchType().(type) {
	case *networkingv1alpha3.StringMatch_Exact:
		hm.Value = v.Exact
	case *networkingv1alpha3.StringMatch_Prefix:
		hm.Value, hm.Regex = regexp.QuoteMeta(v.Prefix)+".*", true
	case *networkingv1alpha3.StringMatch_Regex:
		hm.Value, hm.Regex = "^(?:"+v.Regex+")$", true
		if _, err := regexp.Compile(hm.Value); err != nil {
			bad.addf(path, "not an RE2 expression: %v", err)
		}
	default:
		hm.Value, hm.Regex = ".*", true // present, any value
	}
	return hm
}

// convertVSRetry: no retries field is Istio's default policy (2 attempts,
// on 503 and connect failures); attempts 0 disables retries.
func convertVSRetry(path string, r *networkingv1alpha3.HTTPRetry, st *istioStatus) *waypointapi.Retry {
	if r == nil {
		return &waypointapi.Retry{Attempts: 2, Codes: []uint32{503}}
	}
	if r.GetAttempts() <= 0 {
		return nil
	}
	out := &waypointapi.Retry{Attempts: uint32(r.GetAttempts())}
	if ms, ok := durationMs(r.GetPerTryTimeout()); ok {
		out.PerTryTimeoutMs = ms
	}
	add := func(codes ...uint32) {
		for _, c := range codes {
			if !slices.Contains(out.Codes, c) {
				out.Codes = append(out.Codes, c)
			}
		}
	}
	retryOn := r.GetRetryOn()
	if retryOn == "" {
		retryOn = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
	}
	for _, tok := range strings.Split(retryOn, ",") {
		tok = strings.TrimSpace(tok)
		switch tok {
		case "":
		case "5xx":
			for c := uint32(500); c < 600; c++ {
				add(c)
			}
		case "gateway-error":
			add(502, 503, 504)
		case "retriable-status-codes":
			add(503)
		case "retriable-4xx":
			add(409)
		case "connect-failure", "refused-stream", "reset", "reset-before-request":
			// The waypoint retries connect failures and resets always.
		case "cancelled", "unavailable", "deadline-exceeded", "internal", "resource-exhausted":
			// gRPC status conditions: not evaluated; Istio's default has
			// two of them, so they are dropped without a note.
		default:
			if c, err := strconv.ParseUint(tok, 10, 32); err == nil && c >= 100 && c < 600 {
				add(uint32(c))
				continue
			}
			st.addNote(path + ".retryOn: " + tok + " is not a condition ztunnel-go's waypoint evaluates; it is not retried on")
		}
	}
	sort.Slice(out.Codes, func(i, j int) bool { return out.Codes[i] < out.Codes[j] })
	if len(out.Codes) == 0 {
		// The waypoint reads an empty list as "503 only"; a policy that
		// names no status retries connect failures only.
		out.Codes = []uint32{0}
	}
	return out
}

// convertFault: a fixed delay and an HTTP abort, each for a percentage of
// requests (unset: none, as Istio says).
func convertFault(path string, f *networkingv1alpha3.HTTPFaultInjection, bad *problems) *waypointapi.Fault {
	if f == nil {
		return nil
	}
	out := &waypointapi.Fault{}
	if d := f.GetDelay(); d != nil {
		switch v := d.GetHttpDelayType().(type) {
		case *networkingv1alpha3.HTTPFaultInjection_Delay_FixedDelay:
			ms, _ := durationMs(v.FixedDelay)
			out.DelayMs = ms
		default:
			bad.addf(path+".delay", "only fixedDelay is supported by ztunnel-go's waypoint; requests this rule matches answer 500")
		}
		out.DelayPercent = percentOf(d.GetPercentage(), d.GetPercent())
	}
	if a := f.GetAbort(); a != nil {
		switch v := a.GetErrorType().(type) {
		case *networkingv1alpha3.HTTPFaultInjection_Abort_HttpStatus:
			if v.HttpStatus < 200 || v.HttpStatus > 599 {
				bad.addf(path+".abort.httpStatus", "%d is not an HTTP status; requests this rule matches answer 500", v.HttpStatus)
			}
			out.AbortStatus = uint32(max(v.HttpStatus, 0))
		default:
			bad.addf(path+".abort", "only httpStatus aborts are supported by ztunnel-go's waypoint; requests this rule matches answer 500")
		}
		out.AbortPercent = percentOf(a.GetPercentage(), 0)
	}
	return out
}

func percentOf(p *networkingv1alpha3.Percent, deprecated int32) float64 {
	if p != nil {
		return min(max(p.GetValue(), 0), 100)
	}
	return float64(min(max(deprecated, 0), 100))
}

func durationMs(d *durationpb.Duration) (uint32, bool) {
	if d == nil {
		return 0, false
	}
	ms := d.AsDuration().Milliseconds()
	return uint32(min(max(ms, 0), math.MaxInt32)), true
}

// statuses reports every VirtualService and DestinationRule.
func (ir *istioRouting) statuses() []PolicyStatus {
	var out []PolicyStatus
	report := func(kind string, m map[string]*istioStatus) {
		for _, key := range sortedKeys(m) {
			st := m[key]
			ps := PolicyStatus{Kind: kind, Name: key, Sent: len(st.waypoints) > 0, Invalid: st.invalid}
			switch {
			case len(st.waypoints) > 0:
				sort.Strings(st.waypoints)
				sort.Strings(st.services)
				ps.Message = EnforcedByWaypoint + strings.Join(st.waypoints, ", ") + " for " + strings.Join(st.services, ", ")
			case len(st.gatewaysOnly) > 0:
				ps.Message = NotForMesh + "bound to gateways " + strings.Join(st.gatewaysOnly, ", ") +
					" only, not \"mesh\": it configures those gateway proxies, which ztunnel-go does not run or configure; waypoints apply mesh rules"
			case len(st.displaced) > 0:
				ps.Message = "not applied: Gateway API routes take precedence over a VirtualService for one service (" + strings.Join(st.displaced, "; ") + ")"
			default:
				ps.Message = "not applied: no service bound to a waypoint uses it (node proxies route L4 only; L7 routing needs a waypoint)"
			}
			if len(st.waypoints) > 0 && len(st.displaced) > 0 {
				ps.Message += "; not applied where Gateway API routes take precedence (" + strings.Join(st.displaced, "; ") + ")"
			}
			if len(st.notes) > 0 {
				ps.Message += "; " + strings.Join(st.notes, "; ")
			}
			if len(st.invalid) > 0 {
				ps.Message += "; values that cannot be enforced fail closed: " + strings.Join(st.invalid, "; ")
			}
			out = append(out, ps)
		}
	}
	report(kindVS, ir.vs)
	report(kindDR, ir.dr)
	return out
}
