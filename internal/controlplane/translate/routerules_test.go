package translate

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TestRouteRuleFields: timeouts.backendRequest bounds each request to a
// backend (the waypoint's per-try timeout, also without retries), while a
// rule asking for what the waypoint cannot do (a backendRef's mirror,
// session persistence, a retry backoff) answers 500 instead of routing
// without it, and the route's Accepted condition names each field. Before,
// all four were dropped: backendRequest and the others silently, backoff
// read as a per-try timeout.
func TestRouteRuleFields(t *testing.T) {
	objs := tenantObjects(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: fields, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: cart}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /timeouts}}]
    timeouts: {request: 10s, backendRequest: 2s}
    retry: {attempts: 2, codes: [503]}
    backendRefs: [{name: cart, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /bare}}]
    timeouts: {backendRequest: 1500ms}
    backendRefs: [{name: cart, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /backoff}}]
    retry: {attempts: 2, backoff: 100ms}
    backendRefs: [{name: cart, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /backend-filter}}]
    backendRefs:
    - name: cart
      port: 80
      filters: [{type: RequestMirror, requestMirror: {backendRef: {name: cart, port: 80}}}]
  - matches: [{path: {type: PathPrefix, value: /sticky}}]
    sessionPersistence: {sessionName: s, type: Cookie}
    backendRefs: [{name: cart, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /backend-headers}}]
    backendRefs:
    - name: cart
      port: 80
      filters:
      - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-b, value: "1"}]}}
      - {type: ResponseHeaderModifier, responseHeaderModifier: {remove: [server]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: grpc-fields, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: cart}]
  rules:
  - backendRefs:
    - name: cart
      port: 80
      filters: [{type: RequestMirror, requestMirror: {backendRef: {name: cart, port: 80}}}]
  - sessionPersistence: {sessionName: s, type: Cookie}
    backendRefs: [{name: cart, port: 80}]
`)
	var rules []*waypointapi.RouteRule
	for _, r := range cartRoutes(t, objs) {
		switch r.GetName() {
		case "fields":
			rules = r.GetRules()
		case "grpc-fields":
			for i, rr := range r.GetRules() {
				if len(rr.GetBackends()) != 0 {
					t.Errorf("GRPCRoute rule %d %v routes; it must answer 500", i, rr)
				}
			}
		}
	}
	if len(rules) != 6 {
		t.Fatalf("HTTPRoute rules %v", rules)
	}
	if b := rules[5].GetBackends(); len(b) != 1 || len(b[0].GetRequestHeaderModifiers()) != 1 || b[0].GetRequestHeaderModifiers()[0].GetSet()["x-b"] != "1" ||
		len(b[0].GetResponseHeaderModifiers()) != 1 || b[0].GetResponseHeaderModifiers()[0].GetRemove()[0] != "server" {
		t.Errorf("backend header filters rule %v, want the backend's own modifiers", rules[5])
	}
	if r := rules[0]; r.GetTimeoutMs() != 10000 || r.GetRetry().GetAttempts() != 2 || r.GetRetry().GetPerTryTimeoutMs() != 2000 || len(r.GetBackends()) != 1 {
		t.Errorf("timeouts rule %v, want request 10s, 2 attempts of at most 2s each", r)
	}
	if r := rules[1]; r.GetRetry().GetAttempts() != 0 || r.GetRetry().GetPerTryTimeoutMs() != 1500 || len(r.GetBackends()) != 1 {
		t.Errorf("backendRequest-only rule %v, want one try of at most 1.5s", r)
	}
	for i, name := range []string{"backoff", "backend-filter", "sticky"} {
		if r := rules[2+i]; len(r.GetBackends()) != 0 {
			t.Errorf("%s rule %v routes; it must answer 500", name, r)
		}
		if r := rules[2+i]; r.GetRetry().GetPerTryTimeoutMs() != 0 {
			t.Errorf("%s rule %v has a per-try timeout the route never asked for", name, r)
		}
	}
	acc := routeStatusOf(t, objs, "HTTPRoute", "shop", "fields").Parents[0].Accepted
	if acc.Status || acc.Reason != gatewayv1.RouteReasonUnsupportedValue {
		t.Fatalf("Accepted %+v, want False UnsupportedValue", acc)
	}
	for _, f := range []string{"spec.rules[2].retry.backoff", "spec.rules[3].backendRefs[0].filters", "spec.rules[4].sessionPersistence"} {
		if !strings.Contains(acc.Message, f) {
			t.Errorf("Accepted message %q does not name %s", acc.Message, f)
		}
	}
	gacc := routeStatusOf(t, objs, "GRPCRoute", "shop", "grpc-fields").Parents[0].Accepted
	if gacc.Status || !strings.Contains(gacc.Message, "spec.rules[0].backendRefs[0].filters") || !strings.Contains(gacc.Message, "spec.rules[1].sessionPersistence") {
		t.Errorf("GRPCRoute Accepted %+v, want False naming both rules' fields", gacc)
	}
	if strings.Contains(acc.Message, "spec.rules[0]") || strings.Contains(acc.Message, "spec.rules[1]") {
		t.Errorf("Accepted message %q names a rule the waypoint applies", acc.Message)
	}
}

// TestRouteRedirectRewriteFilters: RequestRedirect (default 302, the
// Gateway API port rule), URLRewrite and ResponseHeaderModifier reach the
// waypoint; a redirect rule has no backends to route to; ReplacePrefixMatch
// on a rule with an Exact match is refused (500, Accepted=False).
func TestRouteRedirectRewriteFilters(t *testing.T) {
	objs := tenantObjects(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: filters, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: cart}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /old}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, hostname: example.org, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}]
  - matches: [{path: {type: PathPrefix, value: /api}}]
    filters:
    - {type: URLRewrite, urlRewrite: {hostname: api.example, path: {type: ReplaceFullPath, replaceFullPath: /v2}}}
    - {type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: x-r, value: "1"}]}}
    - {type: CORS, cors: {allowOrigins: ["https://*.example.com", "http://a.test:8080"], allowMethods: [GET], allowCredentials: true}}
    backendRefs: [{name: cart, port: 80}]
  - matches: [{path: {type: Exact, value: /exact}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /x}}}]
    backendRefs: [{name: cart, port: 80}]
`)
	var rules []*waypointapi.RouteRule
	for _, r := range cartRoutes(t, objs) {
		if r.GetName() == "filters" {
			rules = r.GetRules()
		}
	}
	if len(rules) != 3 {
		t.Fatalf("rules %v", rules)
	}
	want := &waypointapi.Redirect{Scheme: "https", Host: "example.org", Code: 302,
		Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_PREFIX, Value: "/new"}}
	if !proto.Equal(rules[0].GetRedirect(), want) || len(rules[0].GetBackends()) != 0 {
		t.Errorf("redirect rule %v", rules[0])
	}
	wantRw := &waypointapi.Rewrite{Host: "api.example", Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_FULL, Value: "/v2"}}
	if r := rules[1]; !proto.Equal(r.GetRewrite(), wantRw) || len(r.GetBackends()) != 1 || r.GetResponseHeaderModifiers()[0].GetAdd()["x-r"] != "1" {
		t.Errorf("rewrite rule %v", r)
	}
	wantCors := &waypointapi.Cors{AllowOrigins: []string{`https://.*\.example\.com`, `http://a\.test:8080`}, AllowMethods: []string{"GET"},
		MaxAgeS: 5, AllowCredentials: true, UnmatchedPreflight: waypointapi.Cors_ANSWER}
	if !proto.Equal(rules[1].GetCors(), wantCors) {
		t.Errorf("cors %v", rules[1].GetCors())
	}
	if r := rules[2]; len(r.GetBackends()) != 0 {
		t.Errorf("ReplacePrefixMatch on an Exact match %v routes; it must answer 500", r)
	}
	acc := routeStatusOf(t, objs, "HTTPRoute", "shop", "filters").Parents[0].Accepted
	if acc.Status || !strings.Contains(acc.Message, "spec.rules[2]: filter urlRewrite: path.replacePrefixMatch") || strings.Contains(acc.Message, "spec.rules[0]") {
		t.Errorf("Accepted %+v, want False naming rule 2 only", acc)
	}
}
