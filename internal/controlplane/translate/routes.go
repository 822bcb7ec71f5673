package translate

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// attachedRoute is an HTTPRoute or a GRPCRoute, as far as attaching it to a
// service goes.
type attachedRoute struct {
	kind    string // "HTTPRoute" or "GRPCRoute"
	meta    *metav1.ObjectMeta
	parents []gatewayv1.ParentReference
	convert func() *waypointapi.Route
}

func (t *translator) allRoutes() []attachedRoute {
	var all []attachedRoute
	for _, r := range t.objs.HTTPRoutes {
		all = append(all, attachedRoute{kindHTTPRoute, &r.ObjectMeta, r.Spec.ParentRefs, func() *waypointapi.Route { return t.convertRoute(r) }})
	}
	for _, r := range t.objs.GRPCRoutes {
		all = append(all, attachedRoute{kindGRPCRoute, &r.ObjectMeta, r.Spec.ParentRefs, func() *waypointapi.Route { return t.convertGRPCRoute(r) }})
	}
	return all
}

// routesOf returns the routes (in allRoutes order) with a parentRef of
// kind to ns/name, from an index built on first use: a waypoint config
// asks for every service bound to it.
func (t *translator) routesOf(kind, ns, name string) []attachedRoute {
	if t.routesByParent == nil {
		t.routesByParent = map[string][]attachedRoute{}
		for _, r := range t.allRoutes() {
			var keys []string
			for _, pr := range r.parents {
				k := parentKind(pr) + " " + parentNamespace(r.meta.Namespace, pr) + "/" + string(pr.Name)
				if !slices.Contains(keys, k) {
					keys = append(keys, k)
					t.routesByParent[k] = append(t.routesByParent[k], r)
				}
			}
		}
	}
	return t.routesByParent[kind+" "+ns+"/"+name]
}

const (
	kindHTTPRoute = "HTTPRoute"
	kindGRPCRoute = "GRPCRoute"
)

// parentKind is "Service" or "ServiceEntry" for a parentRef the mesh
// serves (GAMMA), "" for any other parent (a Gateway's, not ours).
func parentKind(pr gatewayv1.ParentReference) string {
	group, kind := "", ""
	if pr.Group != nil {
		group = string(*pr.Group)
	}
	if pr.Kind != nil {
		kind = string(*pr.Kind)
	}
	switch {
	case group == "" && kind == "Service":
		return "Service"
	case group == "networking.istio.io" && kind == "ServiceEntry":
		return "ServiceEntry"
	}
	return ""
}

func parentNamespace(routeNs string, pr gatewayv1.ParentReference) string {
	if pr.Namespace != nil && *pr.Namespace != "" {
		return string(*pr.Namespace)
	}
	return routeNs
}

// routesFor returns the HTTPRoutes and GRPCRoutes with a parentRef to the
// service (kind Service, or ServiceEntry of group networking.istio.io),
// oldest first then by namespace/name, as Gateway API orders conflicting
// routes. A route in another namespace than the service's is a consumer
// route (GEP-1426): it carries its namespace as the only client namespace
// it applies to. parentRefs[].port and sectionName scope the route to those
// service ports; a parentRef whose port or section the service lacks
// attaches nothing (its status says NoMatchingParent).
func (t *translator) routesFor(kind string, s *workloadapi.Service) []*waypointapi.Route {
	type picked struct {
		r     attachedRoute
		ports []uint32
	}
	var sel []picked
	for _, r := range t.routesOf(kind, s.GetNamespace(), s.GetName()) {
		attached, allPorts := false, false
		var ports []uint32
		for _, pr := range r.parents {
			if parentKind(pr) != kind || parentNamespace(r.meta.Namespace, pr) != s.GetNamespace() || string(pr.Name) != s.GetName() {
				continue
			}
			p, ok := t.parentPorts(kind, s.GetNamespace(), s.GetName(), pr)
			if !ok {
				continue
			}
			attached = true
			if p == 0 {
				allPorts = true
			} else if !slices.Contains(ports, p) {
				ports = append(ports, p)
			}
		}
		if !attached {
			continue
		}
		if allPorts {
			ports = nil
		}
		slices.Sort(ports)
		sel = append(sel, picked{r, ports})
	}
	sort.SliceStable(sel, func(i, j int) bool {
		a, b := sel[i].r.meta, sel[j].r.meta
		if olderMeta(a, b) != olderMeta(b, a) {
			return olderMeta(a, b)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	var out []*waypointapi.Route
	for _, p := range sel {
		wr := p.r.convert()
		wr.Kind, wr.Ports = p.r.kind, p.ports
		if p.r.meta.Namespace != s.GetNamespace() {
			wr.ClientNamespace = p.r.meta.Namespace
		}
		out = append(out, wr)
	}
	return out
}

// parentPorts resolves a parentRef's port and sectionName against the
// parent's ports: the port number it scopes the route to (0: every port),
// and false when the parent has no such port (or does not exist).
// sectionName names a port (Service spec.ports[].name, ServiceEntry
// spec.ports[].name); with both, they must name the same port.
func (t *translator) parentPorts(kind, ns, name string, pr gatewayv1.ParentReference) (uint32, bool) {
	type port struct {
		number uint32
		name   string
	}
	var ports []port
	switch kind {
	case "Service":
		svc := t.service(ns, name)
		if svc == nil {
			return 0, false
		}
		for _, p := range svc.Spec.Ports {
			ports = append(ports, port{uint32(p.Port), p.Name})
		}
	case "ServiceEntry":
		se := t.serviceEntry(ns, name)
		if se == nil {
			return 0, false
		}
		for _, p := range se.Spec.GetPorts() {
			ports = append(ports, port{p.GetNumber(), p.GetName()})
		}
	default:
		return 0, false
	}
	if pr.Port == nil && (pr.SectionName == nil || *pr.SectionName == "") {
		return 0, true
	}
	for _, p := range ports {
		if pr.Port != nil && uint32(*pr.Port) != p.number {
			continue
		}
		if pr.SectionName != nil && *pr.SectionName != "" && string(*pr.SectionName) != p.name {
			continue
		}
		return p.number, true
	}
	return 0, false
}

func (t *translator) serviceEntry(ns, name string) *networkingv1.ServiceEntry {
	for _, se := range t.objs.ServiceEntries {
		if se.Namespace == ns && se.Name == name {
			return se
		}
	}
	return nil
}

// referenceGranted reports whether a ReferenceGrant in toNs lets routes of
// kind fromKind in fromNs refer to the object group/kind/name there.
func (t *translator) referenceGranted(fromKind, fromNs, toNs, group, kind, name string) bool {
	for _, g := range t.objs.ReferenceGrants {
		if g.Namespace != toNs {
			continue
		}
		from := slices.ContainsFunc(g.Spec.From, func(f gatewayv1.ReferenceGrantFrom) bool {
			return string(f.Group) == gatewayv1.GroupName && string(f.Kind) == fromKind && string(f.Namespace) == fromNs
		})
		to := slices.ContainsFunc(g.Spec.To, func(r gatewayv1.ReferenceGrantTo) bool {
			return string(r.Group) == group && string(r.Kind) == kind && (r.Name == nil || *r.Name == "" || string(*r.Name) == name)
		})
		if from && to {
			return true
		}
	}
	return false
}

// backendRefProblem is why a backendRef is refused, as a Gateway API
// ResolvedRefs reason and a message.
type backendRefProblem struct {
	reason  gatewayv1.RouteConditionReason
	message string
}

// unsupportedFilter makes a rule that uses a filter the waypoint does not
// implement (CORS, ExtensionRef, ExternalAuth; for GRPCRoute also
// RequestMirror) answer 500 (no backends, no answer of its own), as Gateway
// API requires of a filter that cannot be applied: it must not be skipped.
func unsupportedFilter(rr *waypointapi.RouteRule) {
	rr.Backends, rr.Redirect, rr.DirectResponse = nil, nil, nil
}

// unsupportedHTTPRule lists what rule i of an HTTPRoute asks that the
// waypoint cannot do, one "spec.rules[i]...: what" each. A rule with any
// answers 500 (unsupportedFilter) and the route's Accepted condition names
// them: skipping a filter, a backend's filters, session persistence or a
// retry backoff would route differently from what the route says.
func unsupportedHTTPRule(i int, rule gatewayv1.HTTPRouteRule) []string {
	var out []string
	for _, f := range rule.Filters {
		switch {
		case f.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil,
			f.Type == gatewayv1.HTTPRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil,
			f.Type == gatewayv1.HTTPRouteFilterRequestMirror && f.RequestMirror != nil,
			f.Type == gatewayv1.HTTPRouteFilterRequestRedirect && f.RequestRedirect != nil,
			f.Type == gatewayv1.HTTPRouteFilterCORS && f.CORS != nil:
			if f.RequestRedirect != nil && f.RequestRedirect.Path != nil {
				out = append(out, prefixModifierProblem(i, "requestRedirect", f.RequestRedirect.Path, rule.Matches)...)
			}
		case f.Type == gatewayv1.HTTPRouteFilterURLRewrite && f.URLRewrite != nil:
			if f.URLRewrite.Path != nil {
				out = append(out, prefixModifierProblem(i, "urlRewrite", f.URLRewrite.Path, rule.Matches)...)
			}
		default:
			out = append(out, fmt.Sprintf("spec.rules[%d]: filter type %q", i, f.Type))
		}
	}
	for j, b := range rule.BackendRefs {
		for _, f := range b.Filters {
			switch {
			case f.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil,
				f.Type == gatewayv1.HTTPRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil:
			default:
				out = append(out, fmt.Sprintf("spec.rules[%d].backendRefs[%d].filters: filter type %q", i, j, f.Type))
			}
		}
	}
	if rule.SessionPersistence != nil {
		out = append(out, fmt.Sprintf("spec.rules[%d].sessionPersistence", i))
	}
	if rule.Retry != nil && rule.Retry.Backoff != nil {
		out = append(out, fmt.Sprintf("spec.rules[%d].retry.backoff", i))
	}
	return out
}

// unsupportedGRPCRule is unsupportedHTTPRule for a GRPCRoute rule, whose
// only filter the waypoint applies is RequestHeaderModifier.
func unsupportedGRPCRule(i int, rule gatewayv1.GRPCRouteRule) []string {
	var out []string
	headerFilter := func(f gatewayv1.GRPCRouteFilter) bool {
		return f.Type == gatewayv1.GRPCRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil ||
			f.Type == gatewayv1.GRPCRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil
	}
	for _, f := range rule.Filters {
		if !headerFilter(f) {
			out = append(out, fmt.Sprintf("spec.rules[%d]: filter type %q", i, f.Type))
		}
	}
	for j, b := range rule.BackendRefs {
		for _, f := range b.Filters {
			if !headerFilter(f) {
				out = append(out, fmt.Sprintf("spec.rules[%d].backendRefs[%d].filters: filter type %q", i, j, f.Type))
			}
		}
	}
	if rule.SessionPersistence != nil {
		out = append(out, fmt.Sprintf("spec.rules[%d].sessionPersistence", i))
	}
	return out
}

// prefixModifierProblem: ReplacePrefixMatch is only defined for a rule
// whose matches are all PathPrefix (Gateway API: the route is not
// accepted otherwise).
func prefixModifierProblem(i int, filter string, p *gatewayv1.HTTPPathModifier, matches []gatewayv1.HTTPRouteMatch) []string {
	if p.Type != gatewayv1.PrefixMatchHTTPPathModifier {
		return nil
	}
	for _, m := range matches {
		if m.Path != nil && m.Path.Type != nil && *m.Path.Type != gatewayv1.PathMatchPathPrefix {
			return []string{fmt.Sprintf("spec.rules[%d]: filter %s: path.replacePrefixMatch needs every match of the rule to be a PathPrefix", i, filter)}
		}
	}
	return nil
}

// pathModifier converts a Gateway API path modifier (nil: none).
func pathModifier(p *gatewayv1.HTTPPathModifier) *waypointapi.PathModifier {
	if p == nil {
		return nil
	}
	switch {
	case p.Type == gatewayv1.FullPathHTTPPathModifier && p.ReplaceFullPath != nil:
		return &waypointapi.PathModifier{Type: waypointapi.PathModifier_FULL, Value: *p.ReplaceFullPath}
	case p.Type == gatewayv1.PrefixMatchHTTPPathModifier && p.ReplacePrefixMatch != nil:
		return &waypointapi.PathModifier{Type: waypointapi.PathModifier_PREFIX, Value: *p.ReplacePrefixMatch}
	}
	return nil
}

// requestRedirect converts a RequestRedirect filter: Gateway API's
// defaults are status 302 and, for the port, the scheme's well-known port
// when a scheme is set, else the service port (Redirect_GATEWAY).
func requestRedirect(f *gatewayv1.HTTPRequestRedirectFilter) *waypointapi.Redirect {
	rd := &waypointapi.Redirect{Code: 302, Path: pathModifier(f.Path)}
	if f.Scheme != nil {
		rd.Scheme = *f.Scheme
	}
	if f.Hostname != nil {
		rd.Host = string(*f.Hostname)
	}
	if f.Port != nil {
		rd.Port = uint32(*f.Port)
	}
	if f.StatusCode != nil {
		rd.Code = uint32(*f.StatusCode)
	}
	return rd
}

// gatewayCors converts a CORS filter: an origin's host may hold "*",
// matching any run of characters (labels and dots) to its left, and "*"
// alone matches every origin; maxAge defaults to 5 s; a preflight from
// another origin is answered 200 without CORS headers.
func gatewayCors(f *gatewayv1.HTTPCORSFilter) *waypointapi.Cors {
	c := &waypointapi.Cors{MaxAgeS: 5, UnmatchedPreflight: waypointapi.Cors_ANSWER}
	for _, o := range f.AllowOrigins {
		c.AllowOrigins = append(c.AllowOrigins, strings.ReplaceAll(regexp.QuoteMeta(string(o)), `\*`, ".*"))
	}
	for _, m := range f.AllowMethods {
		c.AllowMethods = append(c.AllowMethods, string(m))
	}
	for _, h := range f.AllowHeaders {
		c.AllowHeaders = append(c.AllowHeaders, string(h))
	}
	for _, h := range f.ExposeHeaders {
		c.ExposeHeaders = append(c.ExposeHeaders, string(h))
	}
	if f.MaxAge > 0 {
		c.MaxAgeS = f.MaxAge
	}
	c.AllowCredentials = f.AllowCredentials != nil && *f.AllowCredentials
	return c
}

// urlRewrite converts a URLRewrite filter.
func urlRewrite(f *gatewayv1.HTTPURLRewriteFilter) *waypointapi.Rewrite {
	rw := &waypointapi.Rewrite{Path: pathModifier(f.Path)}
	if f.Hostname != nil {
		rw.Host = string(*f.Hostname)
	}
	return rw
}

func (t *translator) convertRoute(r *gatewayv1.HTTPRoute) *waypointapi.Route {
	wr := &waypointapi.Route{Name: r.Name, Namespace: r.Namespace}
	for _, rule := range r.Spec.Rules {
		rr := &waypointapi.RouteRule{}
		for _, m := range rule.Matches {
			rm := &waypointapi.RouteMatch{}
			if m.Path != nil {
				pm := &waypointapi.PathMatch{Value: "/"}
				if m.Path.Value != nil {
					pm.Value = *m.Path.Value
				}
				if m.Path.Type != nil {
					switch *m.Path.Type {
					case gatewayv1.PathMatchExact:
						pm.Type = waypointapi.PathMatch_EXACT
					case gatewayv1.PathMatchRegularExpression:
						pm.Type = waypointapi.PathMatch_REGULAR_EXPRESSION
					}
				}
				rm.Path = pm
			}
			for _, h := range m.Headers {
				rm.Headers = append(rm.Headers, &waypointapi.HeaderMatch{
					Name: string(h.Name), Value: h.Value,
					Regex: h.Type != nil && *h.Type == gatewayv1.HeaderMatchRegularExpression,
				})
			}
			for _, q := range m.QueryParams {
				rm.QueryParams = append(rm.QueryParams, &waypointapi.HeaderMatch{
					Name: string(q.Name), Value: q.Value,
					Regex: q.Type != nil && *q.Type == gatewayv1.QueryParamMatchRegularExpression,
				})
			}
			if m.Method != nil {
				rm.Method = string(*m.Method)
			}
			rr.Matches = append(rr.Matches, rm)
		}
		for _, b := range rule.BackendRefs {
			be, _ := t.backend(kindHTTPRoute, r.Namespace, r.Spec.ParentRefs, b.BackendRef)
			for _, f := range b.Filters {
				switch {
				case f.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil:
					be.RequestHeaderModifiers = append(be.RequestHeaderModifiers, headerModifier(f.RequestHeaderModifier))
				case f.Type == gatewayv1.HTTPRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil:
					be.ResponseHeaderModifiers = append(be.ResponseHeaderModifiers, headerModifier(f.ResponseHeaderModifier))
				}
			}
			rr.Backends = append(rr.Backends, be)
		}
		for _, f := range rule.Filters {
			switch {
			case f.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil:
				rr.RequestHeaderModifiers = append(rr.RequestHeaderModifiers, headerModifier(f.RequestHeaderModifier))
			case f.Type == gatewayv1.HTTPRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil:
				rr.ResponseHeaderModifiers = append(rr.ResponseHeaderModifiers, headerModifier(f.ResponseHeaderModifier))
			case f.Type == gatewayv1.HTTPRouteFilterRequestMirror && f.RequestMirror != nil:
				if m, _ := t.mirror(r.Namespace, f.RequestMirror); m != nil {
					rr.Mirrors = append(rr.Mirrors, m)
				}
			case f.Type == gatewayv1.HTTPRouteFilterRequestRedirect && f.RequestRedirect != nil:
				rr.Redirect = requestRedirect(f.RequestRedirect)
			case f.Type == gatewayv1.HTTPRouteFilterURLRewrite && f.URLRewrite != nil:
				rr.Rewrite = urlRewrite(f.URLRewrite)
			case f.Type == gatewayv1.HTTPRouteFilterCORS && f.CORS != nil:
				rr.Cors = gatewayCors(f.CORS)
			}
		}
		if rr.Redirect != nil {
			// A redirect answers itself: no backend, no mirror.
			rr.Backends, rr.Mirrors = nil, nil
		}
		if rule.Timeouts != nil && rule.Timeouts.Request != nil {
			if d, err := parseGatewayDuration(string(*rule.Timeouts.Request)); err == nil {
				rr.TimeoutMs = d
			}
		}
		if rule.Retry != nil {
			rt := &waypointapi.Retry{}
			if rule.Retry.Attempts != nil {
				rt.Attempts = uint32(max(*rule.Retry.Attempts, 0))
			}
			for _, c := range rule.Retry.Codes {
				rt.Codes = append(rt.Codes, uint32(c))
			}
			rr.Retry = rt
		}
		// backendRequest bounds each request to a backend, every retry
		// included one by one: the waypoint's per-try timeout.
		if rule.Timeouts != nil && rule.Timeouts.BackendRequest != nil {
			if d, err := parseGatewayDuration(string(*rule.Timeouts.BackendRequest)); err == nil && d > 0 {
				if rr.Retry == nil {
					rr.Retry = &waypointapi.Retry{}
				}
				rr.Retry.PerTryTimeoutMs = d
			}
		}
		if len(unsupportedHTTPRule(0, rule)) > 0 {
			unsupportedFilter(rr)
		}
		wr.Rules = append(wr.Rules, rr)
	}
	return wr
}

// convertGRPCRoute turns a GRPCRoute into the same route form: a gRPC
// method is the request path "/<service>/<method>" (gRPC over HTTP/2), so a
// method match becomes a path match, and headers match as in HTTPRoute.
func (t *translator) convertGRPCRoute(r *gatewayv1.GRPCRoute) *waypointapi.Route {
	wr := &waypointapi.Route{Name: r.Name, Namespace: r.Namespace}
	for _, rule := range r.Spec.Rules {
		rr := &waypointapi.RouteRule{}
		for _, m := range rule.Matches {
			rm := &waypointapi.RouteMatch{}
			if mm := m.Method; mm != nil {
				rm.Path = grpcMethodPath(mm)
			}
			for _, h := range m.Headers {
				rm.Headers = append(rm.Headers, &waypointapi.HeaderMatch{
					Name: string(h.Name), Value: h.Value,
					Regex: h.Type != nil && *h.Type == gatewayv1.GRPCHeaderMatchRegularExpression,
				})
			}
			rr.Matches = append(rr.Matches, rm)
		}
		for _, b := range rule.BackendRefs {
			be, _ := t.backend(kindGRPCRoute, r.Namespace, r.Spec.ParentRefs, b.BackendRef)
			for _, f := range b.Filters {
				switch {
				case f.Type == gatewayv1.GRPCRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil:
					be.RequestHeaderModifiers = append(be.RequestHeaderModifiers, headerModifier(f.RequestHeaderModifier))
				case f.Type == gatewayv1.GRPCRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil:
					be.ResponseHeaderModifiers = append(be.ResponseHeaderModifiers, headerModifier(f.ResponseHeaderModifier))
				}
			}
			rr.Backends = append(rr.Backends, be)
		}
		for _, f := range rule.Filters {
			switch {
			case f.Type == gatewayv1.GRPCRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil:
				rr.RequestHeaderModifiers = append(rr.RequestHeaderModifiers, headerModifier(f.RequestHeaderModifier))
			case f.Type == gatewayv1.GRPCRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil:
				rr.ResponseHeaderModifiers = append(rr.ResponseHeaderModifiers, headerModifier(f.ResponseHeaderModifier))
			}
		}
		if len(unsupportedGRPCRule(0, rule)) > 0 {
			unsupportedFilter(rr)
		}
		wr.Rules = append(wr.Rules, rr)
	}
	return wr
}

// grpcMethodPath is the path match of a GRPCMethodMatch: exact
// "/service/method" when both are exact, else a regular expression over the
// two path segments (an omitted one matches any segment).
func grpcMethodPath(mm *gatewayv1.GRPCMethodMatch) *waypointapi.PathMatch {
	regex := mm.Type != nil && *mm.Type == gatewayv1.GRPCMethodMatchRegularExpression
	svc, method := "", ""
	if mm.Service != nil {
		svc = *mm.Service
	}
	if mm.Method != nil {
		method = *mm.Method
	}
	if !regex && svc != "" && method != "" {
		return &waypointapi.PathMatch{Type: waypointapi.PathMatch_EXACT, Value: "/" + svc + "/" + method}
	}
	segment := func(v string) string {
		switch {
		case v == "":
			return "[^/]+"
		case regex:
			return "(?:" + v + ")"
		default:
			return regexp.QuoteMeta(v)
		}
	}
	return &waypointapi.PathMatch{Type: waypointapi.PathMatch_REGULAR_EXPRESSION, Value: "/" + segment(svc) + "/" + segment(method)}
}

// backend resolves a backendRef of a route (kind routeKind) in namespace
// routeNs: a Service becomes its cluster hostname, a ServiceEntry its first
// host, a Hostname (networking.istio.io) names its host. A reference to
// another namespace needs a ReferenceGrant there (checked first, so that a
// refused reference tells nothing about what exists there); an unknown
// kind or a missing object is refused too. One reference needs no grant:
// a Service that is also one of the route's parentRefs (a consumer route
// sending its own namespace's clients on to the Service they called, as
// GAMMA's MeshConsumerRoute conformance test requires). It gives no reach
// the clients lack, since the route applies only to its own namespace's
// clients, who can call that Service anyway. A refused backend keeps its
// weight and has no hostname: the waypoint answers its share 500, as
// Gateway API requires. The problem, if any, is returned for the status.
func (t *translator) backend(routeKind, routeNs string, parents []gatewayv1.ParentReference, b gatewayv1.BackendRef) (*waypointapi.Backend, *backendRefProblem) {
	ns := routeNs
	if b.Namespace != nil && *b.Namespace != "" {
		ns = string(*b.Namespace)
	}
	weight := uint32(1)
	if b.Weight != nil {
		weight = uint32(max(*b.Weight, 0))
	}
	be := &waypointapi.Backend{Namespace: ns, Weight: weight}
	if b.Port != nil {
		be.Port = uint32(*b.Port)
	}
	group, kind, name := "", "Service", string(b.Name)
	if b.Group != nil {
		group = string(*b.Group)
	}
	if b.Kind != nil {
		kind = string(*b.Kind)
	}
	refuse := func(reason gatewayv1.RouteConditionReason, format string, args ...any) (*waypointapi.Backend, *backendRefProblem) {
		msg := fmt.Sprintf(format, args...)
		be.Refused = msg
		return be, &backendRefProblem{reason, msg}
	}
	switch {
	case group == "" && kind == "Service", group == "networking.istio.io" && (kind == "ServiceEntry" || kind == "Hostname"):
	default:
		return refuse(gatewayv1.RouteReasonInvalidKind, "backendRef %s/%s: kind %q of group %q is not supported (Service, or networking.istio.io ServiceEntry or Hostname)", ns, name, kind, group)
	}
	if ns != routeNs && !isServiceParent(routeNs, parents, group, kind, ns, name) && !t.referenceGranted(routeKind, routeNs, ns, group, kind, name) {
		return refuse(gatewayv1.RouteReasonRefNotPermitted, "backendRef %s %s/%s is in another namespace and no ReferenceGrant in %s allows %s from %s to refer to it", kind, ns, name, ns, routeKind, routeNs)
	}
	switch kind {
	case "Service":
		if t.service(ns, name) == nil {
			return refuse(gatewayv1.RouteReasonBackendNotFound, "backendRef Service %s/%s does not exist", ns, name)
		}
		be.Hostname = name + "." + ns + ".svc." + t.cfg.DomainSuffix
	case "ServiceEntry":
		se := t.serviceEntry(ns, name)
		if se == nil || len(se.Spec.GetHosts()) == 0 {
			return refuse(gatewayv1.RouteReasonBackendNotFound, "backendRef ServiceEntry %s/%s does not exist or has no hosts", ns, name)
		}
		be.Hostname = se.Spec.GetHosts()[0]
	default: // Hostname
		be.Hostname = name
	}
	return be, nil
}

// mirror resolves a RequestMirror filter: its backend as for backendRefs,
// and the share of requests (percent, or fraction over its denominator,
// default 100 %). A refused backend gets no copy (nil).
func (t *translator) mirror(routeNs string, f *gatewayv1.HTTPRequestMirrorFilter) (*waypointapi.Mirror, *backendRefProblem) {
	b, bad := t.backend(kindHTTPRoute, routeNs, nil, gatewayv1.BackendRef{BackendObjectReference: f.BackendRef})
	if bad != nil {
		return nil, bad
	}
	b.Weight = 0
	percent := uint32(100)
	switch {
	case f.Percent != nil:
		percent = uint32(min(max(*f.Percent, 0), 100))
	case f.Fraction != nil:
		den := int32(100)
		if f.Fraction.Denominator != nil && *f.Fraction.Denominator > 0 {
			den = *f.Fraction.Denominator
		}
		percent = uint32(min(max(int64(f.Fraction.Numerator)*100/int64(den), 0), 100))
	}
	return &waypointapi.Mirror{Backend: b, Percent: percent}, nil
}

func headerModifier(f *gatewayv1.HTTPHeaderFilter) *waypointapi.HeaderModifier {
	hm := &waypointapi.HeaderModifier{Remove: f.Remove}
	for _, h := range f.Set {
		if hm.Set == nil {
			hm.Set = map[string]string{}
		}
		hm.Set[string(h.Name)] = h.Value
	}
	for _, h := range f.Add {
		if hm.Add == nil {
			hm.Add = map[string]string{}
		}
		hm.Add[string(h.Name)] = h.Value
	}
	return hm
}

// parseGatewayDuration parses a Gateway API duration ("1h2m3s4ms") into
// milliseconds.
func parseGatewayDuration(s string) (uint32, error) {
	var total uint64
	rest := s
	for rest != "" {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 {
			return 0, fmt.Errorf("duration %q: no number", s)
		}
		n, _ := strconv.ParseUint(rest[:i], 10, 32)
		rest = rest[i:]
		unit := map[string]uint64{"ms": 1, "h": 3600000, "m": 60000, "s": 1000}
		switch {
		case strings.HasPrefix(rest, "ms"):
			total += n * unit["ms"]
			rest = rest[2:]
		case rest != "" && unit[rest[:1]] != 0:
			total += n * unit[rest[:1]]
			rest = rest[1:]
		default:
			return 0, fmt.Errorf("duration %q: bad unit", s)
		}
	}
	return uint32(min(total, 1<<31)), nil
}

// isServiceParent reports whether the Service ns/name (group and kind as a
// backendRef names them) is one of parents, a route in routeNs's parentRefs.
func isServiceParent(routeNs string, parents []gatewayv1.ParentReference, group, kind, ns, name string) bool {
	if group != "" || kind != "Service" {
		return false
	}
	for _, p := range parents {
		pGroup, pKind, pNs := "gateway.networking.k8s.io", "Gateway", routeNs
		if p.Group != nil {
			pGroup = string(*p.Group)
		}
		if p.Kind != nil {
			pKind = string(*p.Kind)
		}
		if p.Namespace != nil && *p.Namespace != "" {
			pNs = string(*p.Namespace)
		}
		if pGroup == "" && pKind == "Service" && pNs == ns && string(p.Name) == name {
			return true
		}
	}
	return false
}
