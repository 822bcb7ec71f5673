package translate

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

const waypointConfigYAML = `
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: demo, annotations: {ztunnel-go.io/waypoint-address: 10.96.9.1}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: idle, namespace: demo, annotations: {ztunnel-go.io/waypoint-address: 10.96.9.2}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  selector: {app: server}
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}, {name: grpc-api, port: 81}, {name: tcp-raw, port: 9000}, {name: web, port: 82, appProtocol: http},
    {name: mysql-db, port: 3306}, {name: other, port: 83}]
---
apiVersion: v1
kind: Service
metadata: {name: unbound, namespace: demo}
spec: {selector: {app: server}, clusterIP: 10.96.0.11, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: v1, namespace: demo}
spec: {selector: {app: server, version: v1}, clusterIP: 10.96.0.21, ports: [{name: http, port: 80}, {name: grpc, port: 81}]}
---
apiVersion: v1
kind: Service
metadata: {name: v2, namespace: demo}
spec: {selector: {app: server, version: v2}, clusterIP: 10.96.0.22, ports: [{name: http, port: 80}, {name: grpc, port: 81}]}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: demo, labels: {app: server}}
spec: {nodeName: node0, serviceAccountName: server, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  action: DENY
  rules:
  - to: [{operation: {paths: ["/admin*", "*.secret", /exact], methods: [GET], hosts: ["*"]}}]
    when: [{key: "request.headers[x-user]", values: [bob]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: baseline, namespace: istio-system}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: GatewayClass, name: istio-waypoint}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: svc-allow, namespace: demo}
spec:
  targetRefs: [{kind: Service, group: "", name: server}]
  rules:
  - from: [{source: {principals: ["cluster.local/ns/demo/sa/client"], namespaces: ["demo"], ipBlocks: [10.0.0.0/8]}}]
  - from: [{source: {requestPrincipals: ["*"]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-bad-when, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  action: DENY
  rules: [{when: [{key: no.such.key, values: [x]}]}]
`

func waypointObjects(t *testing.T) *cluster.Objects {
	t.Helper()
	var objs cluster.Objects
	if errs := cluster.Decode("waypointconfig.yaml", []byte(waypointConfigYAML), &objs); len(errs) > 0 {
		t.Fatalf("decode: %v", errs)
	}
	objs.Sort()
	return &objs
}

func ptr[T any](v T) *T { return &v }

func testRoute(name string, created int64) *gatewayv1.HTTPRoute {
	return &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "demo", CreationTimestamp: metav1.Unix(created, 0)},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{
				Group: ptr(gatewayv1.Group("")), Kind: ptr(gatewayv1.Kind("Service")), Name: "server",
			}}},
			Rules: []gatewayv1.HTTPRouteRule{{
				Matches: []gatewayv1.HTTPRouteMatch{{
					Path:    &gatewayv1.HTTPPathMatch{Type: ptr(gatewayv1.PathMatchPathPrefix), Value: ptr("/api")},
					Headers: []gatewayv1.HTTPHeaderMatch{{Name: "x-v", Value: "2"}},
					Method:  ptr(gatewayv1.HTTPMethodGet),
				}},
				Filters: []gatewayv1.HTTPRouteFilter{{
					Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier,
					RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
						Set: []gatewayv1.HTTPHeader{{Name: "x-route", Value: name}}, Remove: []string{"x-drop"},
					},
				}},
				BackendRefs: []gatewayv1.HTTPBackendRef{
					{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "v1", Port: ptr(gatewayv1.PortNumber(80))}, Weight: ptr(int32(90))}},
					{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: "v2", Port: ptr(gatewayv1.PortNumber(80))}, Weight: ptr(int32(10))}},
				},
				Timeouts: &gatewayv1.HTTPRouteTimeouts{Request: ptr(gatewayv1.Duration("1s500ms"))},
			}},
		},
	}
}

func TestWaypointConfigs(t *testing.T) {
	objs := waypointObjects(t)
	cfg := LocalDefaults()
	res := Translate(cfg, objs, nil)
	other := testRoute("other", 200)
	other.Spec.ParentRefs[0].Name = "unbound"
	withRoutes := *objs
	withRoutes.HTTPRoutes = []*gatewayv1.HTTPRoute{testRoute("newer", 100), testRoute("older", 50), other}
	objs = &withRoutes
	objs.Sort()
	cfgs, statuses := WaypointConfigs(cfg, objs, res)

	if got := slices.Sorted(func(y func(string) bool) {
		for k := range cfgs {
			if !y(k) {
				return
			}
		}
	}); !slices.Equal(got, []string{"demo/idle", "demo/waypoint"}) {
		t.Fatalf("configs = %v, want demo/idle and demo/waypoint", got)
	}
	c := cfgs["demo/waypoint"]
	if c.GetIdentity() != "spiffe://cluster.local/ns/demo/sa/waypoint" {
		t.Errorf("identity = %q", c.GetIdentity())
	}
	if len(c.GetAddresses()) != 1 || netip.AddrFrom4([4]byte(c.GetAddresses()[0])) != netip.MustParseAddr("10.96.9.1") {
		t.Errorf("addresses = %v", c.GetAddresses())
	}
	// Only the bound service; the unbound one would make it an open relay.
	if len(c.GetServices()) != 1 || c.GetServices()[0].GetName() != "server" || c.GetServices()[0].GetKind() != "Service" {
		t.Fatalf("services = %v", c.GetServices())
	}
	svc := c.GetServices()[0]
	protos := map[uint32]waypointapi.Protocol{}
	for _, p := range svc.GetPorts() {
		protos[p.GetPort()] = p.GetProtocol()
	}
	want := map[uint32]waypointapi.Protocol{80: waypointapi.Protocol_HTTP, 81: waypointapi.Protocol_HTTP2, 9000: waypointapi.Protocol_TCP, 82: waypointapi.Protocol_HTTP,
		// Istio's known non-HTTP protocols are TCP; an undeclared one is sniffed.
		3306: waypointapi.Protocol_TCP, 83: waypointapi.Protocol_AUTO}
	for p, w := range want {
		if protos[p] != w {
			t.Errorf("port %d protocol = %v, want %v", p, protos[p], w)
		}
	}
	// Routes of the bound service only, oldest first.
	if len(svc.GetRoutes()) != 2 || svc.GetRoutes()[0].GetName() != "older" || svc.GetRoutes()[1].GetName() != "newer" {
		t.Fatalf("routes = %v", svc.GetRoutes())
	}
	rr := svc.GetRoutes()[0].GetRules()[0]
	if b := rr.GetBackends(); len(b) != 2 || b[0].GetHostname() != "v1.demo.svc.cluster.local" || b[0].GetWeight() != 90 || b[1].GetWeight() != 10 || b[0].GetPort() != 80 {
		t.Errorf("backends = %v", b)
	}
	if rr.GetTimeoutMs() != 1500 || rr.GetMatches()[0].GetMethod() != "GET" || rr.GetMatches()[0].GetPath().GetValue() != "/api" ||
		rr.GetRequestHeaderModifiers()[0].GetSet()["x-route"] != "older" {
		t.Errorf("rule = %v", rr)
	}

	pols := map[string]*waypointapi.Policy{}
	for _, p := range c.GetPolicies() {
		pols[p.GetNamespace()+"/"+p.GetName()] = p
	}
	for _, k := range []string{"demo/deny-admin", "istio-system/baseline", "demo/svc-allow", "demo/deny-bad-when"} {
		if pols[k] == nil {
			t.Errorf("policy %s missing from the config; have %v", k, pols)
		}
	}
	if p := pols["istio-system/baseline"]; p != nil && (p.GetAction() != waypointapi.Action_ALLOW || len(p.GetRules()) != 0 || len(p.GetServices()) != 0) {
		t.Errorf("baseline = %v, want an ALLOW without rules for the whole waypoint (denies all)", p)
	}
	if p := pols["demo/svc-allow"]; p != nil {
		if !slices.Equal(p.GetServices(), []string{"server.demo.svc.cluster.local"}) {
			t.Errorf("svc-allow services = %v", p.GetServices())
		}
		// The requestPrincipals rule is the waypoint's (RequestAuthentication).
		if len(p.GetRules()) != 2 || p.GetRules()[0].GetFrom()[0].GetPrincipals()[0].GetExact() != "cluster.local/ns/demo/sa/client" ||
			!p.GetRules()[1].GetFrom()[0].GetRequestPrincipals()[0].GetPresence() {
			t.Errorf("svc-allow rules = %v", p.GetRules())
		}
	}
	if p := pols["demo/deny-admin"]; p != nil {
		paths := p.GetRules()[0].GetTo()[0].GetPaths()
		if paths[0].GetPrefix() != "/admin" || paths[1].GetSuffix() != ".secret" || paths[2].GetExact() != "/exact" ||
			!p.GetRules()[0].GetTo()[0].GetHosts()[0].GetPresence() || p.GetRules()[0].GetWhen()[0].GetKey() != "request.headers[x-user]" {
			t.Errorf("deny-admin = %v", protojson.Format(p))
		}
	}
	// A DENY rule with an unknown key matches every request (fail closed).
	if p := pols["demo/deny-bad-when"]; p != nil && (len(p.GetRules()) != 1 || len(p.GetRules()[0].GetWhen()) != 0) {
		t.Errorf("deny-bad-when = %v, want one empty rule", p)
	}
	// The class baseline also reaches the idle waypoint, which has no services.
	if idle := cfgs["demo/idle"]; len(idle.GetServices()) != 0 || len(idle.GetPolicies()) != 1 {
		t.Errorf("idle = %v", idle)
	}

	st := map[string]PolicyStatus{}
	for _, s := range statuses {
		st[s.Name] = s
	}
	if m := st["demo/deny-admin"].Message; !strings.HasPrefix(m, EnforcedByWaypoint+"demo/waypoint ") {
		t.Errorf("deny-admin status = %q", m)
	}
	if m := st["istio-system/baseline"].Message; !strings.HasPrefix(m, EnforcedByWaypoint+"demo/idle, demo/waypoint ") {
		t.Errorf("baseline status = %q", m)
	}
	if s := st["demo/svc-allow"]; !strings.HasPrefix(s.Message, EnforcedByWaypoint+"demo/waypoint") || len(s.Invalid) != 0 {
		t.Errorf("svc-allow status = %+v", s)
	}
	// The Result itself is not changed.
	for _, s := range res.Policies {
		if strings.HasPrefix(s.Message, EnforcedByWaypoint) {
			t.Errorf("Result.Policies mutated: %+v", s)
		}
	}
}

func TestParseGatewayDuration(t *testing.T) {
	for in, want := range map[string]uint32{"1s": 1000, "1h2m3s4ms": 3723004, "250ms": 250, "0s": 0} {
		if got, err := parseGatewayDuration(in); err != nil || got != want {
			t.Errorf("parseGatewayDuration(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1", "s", "1d"} {
		if _, err := parseGatewayDuration(in); err == nil && in != "" {
			t.Errorf("parseGatewayDuration(%q) accepted", in)
		}
	}
}

// TestWaypointGRPCRoutes: a GRPCRoute attached to a bound service becomes a
// route whose method matches are path matches ("/service/method"), ordered
// with the HTTPRoutes by age; a RequestMirror filter becomes a mirror with
// its share; a rule with a filter the waypoint does not implement answers
// 500 (no backends) rather than skipping the filter.
func TestWaypointGRPCRoutes(t *testing.T) {
	objs := waypointObjects(t)
	cfg := LocalDefaults()
	res := Translate(cfg, objs, nil)
	parent := gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{
		Group: ptr(gatewayv1.Group("")), Kind: ptr(gatewayv1.Kind("Service")), Name: "server",
	}}}
	backend := func(name string, w int32) gatewayv1.GRPCBackendRef {
		return gatewayv1.GRPCBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(name), Port: ptr(gatewayv1.PortNumber(81))}, Weight: ptr(w)}}
	}
	grpc := &gatewayv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-grpc", Namespace: "demo", CreationTimestamp: metav1.Unix(10, 0)},
		Spec: gatewayv1.GRPCRouteSpec{CommonRouteSpec: parent, Rules: []gatewayv1.GRPCRouteRule{
			{
				Matches:     []gatewayv1.GRPCRouteMatch{{Method: &gatewayv1.GRPCMethodMatch{Service: ptr("echo.v1.Echo"), Method: ptr("Say")}}},
				BackendRefs: []gatewayv1.GRPCBackendRef{backend("v2", 1)},
			},
			{
				Matches: []gatewayv1.GRPCRouteMatch{
					{Method: &gatewayv1.GRPCMethodMatch{Service: ptr("echo.v1.Echo")}},
					{Method: &gatewayv1.GRPCMethodMatch{Type: ptr(gatewayv1.GRPCMethodMatchRegularExpression), Method: ptr("Get.*")},
						Headers: []gatewayv1.GRPCHeaderMatch{{Name: "x-tenant", Value: "a"}}},
				},
				BackendRefs: []gatewayv1.GRPCBackendRef{backend("v1", 1)},
			},
		}},
	}
	mirror := testRoute("mirror", 20)
	mirror.Spec.Rules[0].Filters = append(mirror.Spec.Rules[0].Filters, gatewayv1.HTTPRouteFilter{
		Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{
			BackendRef: gatewayv1.BackendObjectReference{Name: "v2", Port: ptr(gatewayv1.PortNumber(80))}, Fraction: &gatewayv1.Fraction{Numerator: 1, Denominator: ptr(int32(4))}},
	})
	// A rule with an unimplemented filter.
	mirror.Spec.Rules = append(mirror.Spec.Rules, gatewayv1.HTTPRouteRule{
		Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterExtensionRef, ExtensionRef: &gatewayv1.LocalObjectReference{
			Group: "example.com", Kind: "Plugin", Name: "p"}}},
		BackendRefs: mirror.Spec.Rules[0].BackendRefs,
	})
	withRoutes := *objs
	withRoutes.GRPCRoutes = []*gatewayv1.GRPCRoute{grpc}
	withRoutes.HTTPRoutes = []*gatewayv1.HTTPRoute{mirror}
	cfgs, _ := WaypointConfigs(cfg, &withRoutes, res)
	routes := cfgs["demo/waypoint"].GetServices()[0].GetRoutes()
	if len(routes) != 2 || routes[0].GetName() != "echo-grpc" || routes[1].GetName() != "mirror" {
		t.Fatalf("routes = %v, want echo-grpc (older) then mirror", routes)
	}
	rules := routes[0].GetRules()
	if p := rules[0].GetMatches()[0].GetPath(); p.GetType() != waypointapi.PathMatch_EXACT || p.GetValue() != "/echo.v1.Echo/Say" {
		t.Errorf("exact method match = %v", p)
	}
	if p := rules[1].GetMatches()[0].GetPath(); p.GetType() != waypointapi.PathMatch_REGULAR_EXPRESSION || p.GetValue() != `/echo\.v1\.Echo/[^/]+` {
		t.Errorf("service-only match = %v", p)
	}
	m := rules[1].GetMatches()[1]
	if p := m.GetPath(); p.GetValue() != "/[^/]+/(?:Get.*)" || len(m.GetHeaders()) != 1 || m.GetHeaders()[0].GetName() != "x-tenant" {
		t.Errorf("regex method + header match = %v", m)
	}
	if b := rules[1].GetBackends(); len(b) != 1 || b[0].GetHostname() != "v1.demo.svc.cluster.local" || b[0].GetPort() != 81 {
		t.Errorf("backends = %v", b)
	}
	mr := routes[1].GetRules()[0]
	if m := mr.GetMirrors(); len(m) != 1 || m[0].GetBackend().GetHostname() != "v2.demo.svc.cluster.local" || m[0].GetBackend().GetPort() != 80 || m[0].GetPercent() != 25 {
		t.Errorf("mirrors = %v, want v2:80 at 25 %%", m)
	}
	if len(mr.GetBackends()) != 2 {
		t.Errorf("the mirroring rule's backends = %v", mr.GetBackends())
	}
	if b := routes[1].GetRules()[1].GetBackends(); len(b) != 0 {
		t.Errorf("a rule with an unimplemented filter (ExtensionRef) kept backends %v; it must answer 500", b)
	}
}
