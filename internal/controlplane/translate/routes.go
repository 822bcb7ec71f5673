package translate

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// attachedRoute is an HTTPRoute or a GRPCRoute, as far as attaching it to a
// service goes.
type attachedRoute struct {
	meta    *metav1.ObjectMeta
	parents []gatewayv1.ParentReference
	convert func() *waypointapi.Route
}

// routesFor returns the HTTPRoutes and GRPCRoutes with a parentRef to the
// service (kind Service, or ServiceEntry of group networking.istio.io),
// oldest first then by namespace/name, as Gateway API orders conflicting
// routes.
func (t *translator) routesFor(kind string, s *workloadapi.Service) []*waypointapi.Route {
	var all []attachedRoute
	for _, r := range t.objs.HTTPRoutes {
		all = append(all, attachedRoute{&r.ObjectMeta, r.Spec.ParentRefs, func() *waypointapi.Route { return t.convertRoute(r) }})
	}
	for _, r := range t.objs.GRPCRoutes {
		all = append(all, attachedRoute{&r.ObjectMeta, r.Spec.ParentRefs, func() *waypointapi.Route { return t.convertGRPCRoute(r) }})
	}
	var picked []attachedRoute
	for _, r := range all {
		for _, pr := range r.parents {
			ns := r.meta.Namespace
			if pr.Namespace != nil {
				ns = string(*pr.Namespace)
			}
			group, k := "", ""
			if pr.Group != nil {
				group = string(*pr.Group)
			}
			if pr.Kind != nil {
				k = string(*pr.Kind)
			}
			want := group == "" && k == "Service"
			if kind == "ServiceEntry" {
				want = group == "networking.istio.io" && k == "ServiceEntry"
			}
			if want && ns == s.GetNamespace() && string(pr.Name) == s.GetName() {
				picked = append(picked, r)
				break
			}
		}
	}
	sort.SliceStable(picked, func(i, j int) bool {
		a, b := picked[i].meta, picked[j].meta
		if olderMeta(a, b) != olderMeta(b, a) {
			return olderMeta(a, b)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	var out []*waypointapi.Route
	for _, r := range picked {
		out = append(out, r.convert())
	}
	return out
}

// unsupportedFilter makes a rule that uses a filter the waypoint does not
// implement (anything but RequestHeaderModifier and, for HTTPRoute,
// RequestMirror) answer 500 (no backends), as Gateway API requires of a filter
// that cannot be applied: it must not be skipped.
func unsupportedFilter(rr *waypointapi.RouteRule) { rr.Backends = nil }

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
			rr.Backends = append(rr.Backends, t.backend(r.Namespace, b.BackendRef))
		}
		unsupported := false
		for _, f := range rule.Filters {
			switch {
			case f.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil:
				rr.RequestHeaderModifiers = append(rr.RequestHeaderModifiers, headerModifier(f.RequestHeaderModifier))
			case f.Type == gatewayv1.HTTPRouteFilterRequestMirror && f.RequestMirror != nil:
				rr.Mirrors = append(rr.Mirrors, t.mirror(r.Namespace, f.RequestMirror))
			default:
				unsupported = true
			}
		}
		if unsupported {
			unsupportedFilter(rr)
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
			if rule.Retry.Backoff != nil {
				if d, err := parseGatewayDuration(string(*rule.Retry.Backoff)); err == nil {
					rt.PerTryTimeoutMs = d
				}
			}
			rr.Retry = rt
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
			rr.Backends = append(rr.Backends, t.backend(r.Namespace, b.BackendRef))
		}
		unsupported := false
		for _, f := range rule.Filters {
			switch {
			case f.Type == gatewayv1.GRPCRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil:
				rr.RequestHeaderModifiers = append(rr.RequestHeaderModifiers, headerModifier(f.RequestHeaderModifier))
			default:
				unsupported = true
			}
		}
		if unsupported {
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

// backend resolves a backendRef of a route in namespace ns: a Service
// becomes its cluster hostname, a ServiceEntry or Hostname backend names
// its host.
func (t *translator) backend(ns string, b gatewayv1.BackendRef) *waypointapi.Backend {
	if b.Namespace != nil {
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
	if b.Kind == nil || *b.Kind == "Service" {
		be.Hostname = string(b.Name) + "." + ns + ".svc." + t.cfg.DomainSuffix
	} else {
		be.Hostname = string(b.Name)
	}
	return be
}

// mirror resolves a RequestMirror filter: its backend as for backendRefs,
// and the share of requests (percent, or fraction over its denominator,
// default 100 %).
func (t *translator) mirror(ns string, f *gatewayv1.HTTPRequestMirrorFilter) *waypointapi.Mirror {
	b := t.backend(ns, gatewayv1.BackendRef{BackendObjectReference: f.BackendRef})
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
	return &waypointapi.Mirror{Backend: b, Percent: percent}
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
