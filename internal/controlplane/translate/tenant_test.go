package translate

import (
	"slices"
	"strings"
	"testing"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// tenantYAML: the victim's namespace "shop" with a waypoint-bound Service
// "cart" and a second Service "payments"; the attacker owns namespace
// "evil", with a Service "sink" of its own.
const tenantYAML = `
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Namespace
metadata: {name: evil, labels: {istio.io/dataplane-mode: ambient, team: evil}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop, annotations: {ztunnel-go.io/waypoint-address: 10.96.9.1}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: Service
metadata: {name: cart, namespace: shop, labels: {istio.io/use-waypoint: waypoint}}
spec:
  selector: {app: cart}
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}, {name: http-admin, port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: payments, namespace: shop}
spec: {selector: {app: payments}, clusterIP: 10.96.0.11, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: sink, namespace: evil}
spec: {selector: {app: sink}, clusterIP: 10.96.0.12, ports: [{name: http, port: 80}]}
`

func tenantObjects(t *testing.T, extra string) *cluster.Objects {
	t.Helper()
	var objs cluster.Objects
	if errs := cluster.Decode("tenant.yaml", []byte(tenantYAML+"---\n"+extra), &objs); len(errs) > 0 {
		t.Fatalf("decode: %v", errs)
	}
	objs.Sort()
	return &objs
}

// cartRoutes returns the routes the waypoint config attaches to shop/cart.
func cartRoutes(t *testing.T, objs *cluster.Objects) []*waypointapi.Route {
	t.Helper()
	cfg := LocalDefaults()
	cfgs, _ := WaypointConfigs(cfg, objs, Translate(cfg, objs, nil))
	c := cfgs["shop/waypoint"]
	for _, s := range c.GetServices() {
		if s.GetName() == "cart" {
			return s.GetRoutes()
		}
	}
	t.Fatalf("shop/cart not bound to shop/waypoint: %v", c)
	return nil
}

func routeStatusOf(t *testing.T, objs *cluster.Objects, kind, ns, name string) RouteStatus {
	t.Helper()
	for _, st := range RouteStatuses(LocalDefaults(), objs) {
		if st.Kind == kind && st.Namespace == ns && st.Name == name {
			return st
		}
	}
	t.Fatalf("no status for %s %s/%s", kind, ns, name)
	return RouteStatus{}
}

// TestConsumerRouteScoping: a route in the Service's namespace is a
// producer route (every client); a route in another namespace is a
// consumer route that the waypoint applies only to clients of that
// namespace (GEP-1426), and its status says so.
func TestConsumerRouteScoping(t *testing.T) {
	objs := tenantObjects(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: producer, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  parentRefs: [{group: "", kind: Service, name: cart}]
  rules: [{backendRefs: [{name: cart, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: hijack, namespace: evil, creationTimestamp: "2025-01-01T00:00:00Z"}
spec:
  parentRefs: [{group: "", kind: Service, name: cart, namespace: shop}]
  rules: [{backendRefs: [{name: sink, port: 80}]}]
`)
	routes := cartRoutes(t, objs)
	got := map[string]*waypointapi.Route{}
	for _, r := range routes {
		got[r.GetNamespace()+"/"+r.GetName()] = r
	}
	if len(routes) != 2 || got["shop/producer"] == nil || got["evil/hijack"] == nil {
		t.Fatalf("routes = %v, want shop/producer and evil/hijack", routes)
	}
	if cn := got["shop/producer"].GetClientNamespace(); cn != "" {
		t.Errorf("producer route client_namespace = %q, want \"\" (every client)", cn)
	}
	if cn := got["evil/hijack"].GetClientNamespace(); cn != "evil" {
		t.Errorf("consumer route client_namespace = %q, want evil: it must apply to the attacker's own clients only", cn)
	}
	if k := got["evil/hijack"].GetKind(); k != "HTTPRoute" {
		t.Errorf("kind = %q", k)
	}
	// Its own backend (same namespace as the route) needs no grant.
	if b := got["evil/hijack"].GetRules()[0].GetBackends()[0]; b.GetHostname() != "sink.evil.svc.cluster.local" || b.GetRefused() != "" {
		t.Errorf("consumer backend = %v", b)
	}
	st := routeStatusOf(t, objs, "HTTPRoute", "evil", "hijack")
	if len(st.Parents) != 1 || !st.Parents[0].Accepted.Status || !strings.Contains(st.Parents[0].Accepted.Message, "consumer route") {
		t.Errorf("hijack status = %+v", st)
	}
	st = routeStatusOf(t, objs, "HTTPRoute", "shop", "producer")
	if len(st.Parents) != 1 || !st.Parents[0].Accepted.Status || !strings.Contains(st.Parents[0].Accepted.Message, "producer route") {
		t.Errorf("producer status = %+v", st)
	}
}

// TestRouteParentPort: parentRefs[].port and sectionName scope a route to
// that Service port; one the Service lacks attaches nothing and is
// NoMatchingParent.
func TestRouteParentPort(t *testing.T) {
	objs := tenantObjects(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: by-port, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  parentRefs: [{group: "", kind: Service, name: cart, port: 80}]
  rules: [{backendRefs: [{name: cart, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: by-section, namespace: shop, creationTimestamp: "2026-01-02T00:00:00Z"}
spec:
  parentRefs: [{group: "", kind: Service, name: cart, sectionName: http-admin}]
  rules: [{backendRefs: [{name: cart, port: 8080}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: no-port, namespace: shop, creationTimestamp: "2026-01-03T00:00:00Z"}
spec:
  parentRefs: [{group: "", kind: Service, name: cart, port: 9999}]
  rules: [{backendRefs: [{name: cart, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mismatch, namespace: shop, creationTimestamp: "2026-01-04T00:00:00Z"}
spec:
  parentRefs: [{group: "", kind: Service, name: cart, port: 80, sectionName: http-admin}]
  rules: [{backendRefs: [{name: cart, port: 80}]}]
`)
	got := map[string][]uint32{}
	for _, r := range cartRoutes(t, objs) {
		got[r.GetName()] = r.GetPorts()
	}
	if len(got) != 2 || !slices.Equal(got["by-port"], []uint32{80}) || !slices.Equal(got["by-section"], []uint32{8080}) {
		t.Fatalf("route ports = %v, want by-port [80] and by-section [8080] only", got)
	}
	for _, name := range []string{"no-port", "mismatch"} {
		st := routeStatusOf(t, objs, "HTTPRoute", "shop", name)
		if a := st.Parents[0].Accepted; a.Status || a.Reason != gatewayv1.RouteReasonNoMatchingParent {
			t.Errorf("%s Accepted = %+v, want False NoMatchingParent", name, a)
		}
	}
}

const crossNamespaceRoute = `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: steal, namespace: evil}
spec:
  parentRefs: [{group: "", kind: Service, name: sink}]
  rules:
  - backendRefs:
    - {name: payments, namespace: shop, port: 80, weight: 1}
    - {name: sink, port: 80, weight: 3}
    filters:
    - type: RequestMirror
      requestMirror: {backendRef: {name: payments, namespace: shop, port: 80}}
`

// TestReferenceGrantBackend: a backendRef (or mirror) into another
// namespace is refused without a ReferenceGrant there (RefNotPermitted; the
// backend keeps its weight with no hostname, so its share answers 500 and
// the mirror is dropped), followed with one, and refused again when the
// grant is in the wrong namespace, for another kind or another name.
func TestReferenceGrantBackend(t *testing.T) {
	check := func(t *testing.T, grant string, permitted bool) {
		t.Helper()
		objs := tenantObjects(t, crossNamespaceRoute+"---\n"+grant)
		// evil/sink is not waypoint-bound; resolve the rule directly.
		tr := newTranslator(LocalDefaults().withDefaults(), objs, nil)
		tr.buildIndex()
		wr := tr.convertRoute(objs.HTTPRoutes[0])
		b := wr.GetRules()[0].GetBackends()
		st := routeStatusOf(t, objs, "HTTPRoute", "evil", "steal")
		rr := st.Parents[0].ResolvedRefs
		if permitted {
			if b[0].GetHostname() != "payments.shop.svc.cluster.local" || b[0].GetRefused() != "" || len(wr.GetRules()[0].GetMirrors()) != 1 {
				t.Errorf("granted: backends %v mirrors %v", b, wr.GetRules()[0].GetMirrors())
			}
			if !rr.Status || rr.Reason != gatewayv1.RouteReasonResolvedRefs {
				t.Errorf("granted: ResolvedRefs = %+v", rr)
			}
			return
		}
		if b[0].GetHostname() != "" || b[0].GetRefused() == "" || b[0].GetWeight() != 1 || b[1].GetHostname() != "sink.evil.svc.cluster.local" {
			t.Errorf("refused: backends = %v, want the cross-namespace one refused with weight 1 and no hostname", b)
		}
		if len(wr.GetRules()[0].GetMirrors()) != 0 {
			t.Errorf("refused: mirrors = %v, want none", wr.GetRules()[0].GetMirrors())
		}
		if rr.Status || rr.Reason != gatewayv1.RouteReasonRefNotPermitted || !strings.Contains(rr.Message, "ReferenceGrant") {
			t.Errorf("refused: ResolvedRefs = %+v, want False RefNotPermitted", rr)
		}
	}
	t.Run("none", func(t *testing.T) { check(t, "", false) })
	t.Run("granted", func(t *testing.T) {
		check(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: allow-evil, namespace: shop}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: evil}]
  to: [{group: "", kind: Service, name: payments}]
`, true)
	})
	t.Run("grant in the attacker's namespace", func(t *testing.T) {
		check(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: self-granted, namespace: evil}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: evil}]
  to: [{group: "", kind: Service}]
`, false)
	})
	t.Run("grant for GRPCRoute", func(t *testing.T) {
		check(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: grpc-only, namespace: shop}
spec:
  from: [{group: gateway.networking.k8s.io, kind: GRPCRoute, namespace: evil}]
  to: [{group: "", kind: Service}]
`, false)
	})
	t.Run("grant for another name", func(t *testing.T) {
		check(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: cart-only, namespace: shop}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: evil}]
  to: [{group: "", kind: Service, name: cart}]
`, false)
	})
}

// TestConsumerRouteOwnParentBackend: a consumer route in evil whose parentRef
// is shop/cart may send to shop/cart itself with no ReferenceGrant (GAMMA's
// MeshConsumerRoute: its clients reach shop/cart anyway), but any other
// Service of shop stays refused, also when the route names it as a
// parentRef of another kind (a Gateway) or lists shop/cart only as the backend.
func TestConsumerRouteOwnParentBackend(t *testing.T) {
	objs := tenantObjects(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: consumer, namespace: evil}
spec:
  parentRefs: [{group: "", kind: Service, name: cart, namespace: shop}]
  rules:
  - backendRefs:
    - {name: cart, namespace: shop, port: 80}
    - {name: payments, namespace: shop, port: 80}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: not-parent, namespace: evil}
spec:
  parentRefs:
  - {group: "", kind: Service, name: sink}
  - {name: cart, namespace: shop}
  rules: [{backendRefs: [{name: cart, namespace: shop, port: 80}]}]
`)
	tr := newTranslator(LocalDefaults().withDefaults(), objs, nil)
	tr.buildIndex()
	for _, r := range objs.HTTPRoutes {
		b := tr.convertRoute(r).GetRules()[0].GetBackends()
		switch r.Name {
		case "consumer":
			if b[0].GetHostname() != "cart.shop.svc.cluster.local" || b[0].GetRefused() != "" {
				t.Errorf("consumer route: its own parent as backend = %v, want resolved", b[0])
			}
			if b[1].GetHostname() != "" || !strings.Contains(b[1].GetRefused(), "ReferenceGrant") {
				t.Errorf("consumer route: another Service of shop = %v, want refused", b[1])
			}
		case "not-parent":
			if b[0].GetHostname() != "" || !strings.Contains(b[0].GetRefused(), "ReferenceGrant") {
				t.Errorf("a Gateway parentRef named like the Service: backend = %v, want refused", b[0])
			}
		}
	}
	st := routeStatusOf(t, objs, "HTTPRoute", "evil", "consumer")
	if len(st.Parents) == 0 {
		t.Fatal("consumer route: no parent status")
	}
	for _, p := range st.Parents {
		if rr := p.ResolvedRefs; rr.Status || rr.Reason != gatewayv1.RouteReasonRefNotPermitted || !strings.Contains(rr.Message, "payments") {
			t.Errorf("consumer route ResolvedRefs = %+v, want False RefNotPermitted naming payments", rr)
		}
	}
}

// TestRouteStatusReasons: BackendNotFound, InvalidKind and an unsupported
// filter (Accepted False UnsupportedValue), and a parent that does not
// exist (NoMatchingParent); a Gateway parent gets no entry of ours.
func TestRouteStatusReasons(t *testing.T) {
	objs := tenantObjects(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: missing, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: cart}]
  rules: [{backendRefs: [{name: nope, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: badkind, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: cart}]
  rules: [{backendRefs: [{group: example.com, kind: Bucket, name: b}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: redirect, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: cart}]
  rules:
  - filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Plugin, name: p}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: orphan, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: gone}, {name: ingress}]
  rules: [{backendRefs: [{name: cart, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: ingress-only, namespace: shop}
spec:
  parentRefs: [{name: ingress}]
  rules: [{backendRefs: [{name: cart, port: 80}]}]
`)
	for _, tc := range []struct {
		name             string
		accepted         bool
		acceptedReason   gatewayv1.RouteConditionReason
		resolved         bool
		resolvedReason   gatewayv1.RouteConditionReason
		resolvedContains string
	}{
		{"missing", true, gatewayv1.RouteReasonAccepted, false, gatewayv1.RouteReasonBackendNotFound, "shop/nope does not exist"},
		{"badkind", true, gatewayv1.RouteReasonAccepted, false, gatewayv1.RouteReasonInvalidKind, "Bucket"},
		{"redirect", false, gatewayv1.RouteReasonUnsupportedValue, true, gatewayv1.RouteReasonResolvedRefs, ""},
		{"orphan", false, gatewayv1.RouteReasonNoMatchingParent, true, gatewayv1.RouteReasonResolvedRefs, ""},
	} {
		st := routeStatusOf(t, objs, "HTTPRoute", "shop", tc.name)
		if len(st.Parents) != 1 {
			t.Errorf("%s: %d parents, want 1 (a Gateway parent is not ours)", tc.name, len(st.Parents))
			continue
		}
		p := st.Parents[0]
		if p.Accepted.Status != tc.accepted || p.Accepted.Reason != tc.acceptedReason {
			t.Errorf("%s: Accepted = %+v, want %v %s", tc.name, p.Accepted, tc.accepted, tc.acceptedReason)
		}
		if p.ResolvedRefs.Status != tc.resolved || p.ResolvedRefs.Reason != tc.resolvedReason || !strings.Contains(p.ResolvedRefs.Message, tc.resolvedContains) {
			t.Errorf("%s: ResolvedRefs = %+v, want %v %s containing %q", tc.name, p.ResolvedRefs, tc.resolved, tc.resolvedReason, tc.resolvedContains)
		}
	}
	for _, st := range RouteStatuses(LocalDefaults(), objs) {
		if st.Name == "ingress-only" {
			t.Errorf("a route with only a Gateway parent got a mesh status: %+v", st)
		}
	}
	// The missing backend answers 500: refused, no hostname.
	for _, r := range cartRoutes(t, objs) {
		if r.GetName() == "missing" {
			if b := r.GetRules()[0].GetBackends()[0]; b.GetHostname() != "" || b.GetRefused() == "" {
				t.Errorf("missing backend = %v, want refused", b)
			}
		}
	}
}

// TestCrossNamespaceWaypoint: a Service may name another namespace's
// waypoint (istio.io/use-waypoint-namespace) only as the waypoint's HBONE
// listener allows (allowedRoutes.namespaces, default Same), as istiod
// decides; a refused binding leaves the Service without a waypoint and
// says why.
func TestCrossNamespaceWaypoint(t *testing.T) {
	const svc = `
apiVersion: v1
kind: Service
metadata:
  name: grab
  namespace: evil
  labels: {istio.io/use-waypoint: waypoint, istio.io/use-waypoint-namespace: shop}
spec: {selector: {app: grab}, clusterIP: 10.96.0.20, ports: [{name: http, port: 80}]}
`
	gateway := func(allowed string) string {
		return `
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop, annotations: {ztunnel-go.io/waypoint-address: 10.96.9.1}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE` + allowed + `}]
`
	}
	// cartBound: the waypoint's own namespace is subject to a Selector
	// too, as in istiod (shop has no team label).
	for _, tc := range []struct {
		name             string
		allowed          string
		bound, cartBound bool
	}{
		{"default Same", "", false, true},
		{"Same", ", allowedRoutes: {namespaces: {from: Same}}", false, true},
		{"All", ", allowedRoutes: {namespaces: {from: All}}", true, true},
		{"Selector matching", ", allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {team: evil}}}}", true, false},
		{"Selector not matching", ", allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {team: shop}}}}", false, false},
		{"Selector invalid", ", allowedRoutes: {namespaces: {from: Selector, selector: {matchExpressions: [{key: team, operator: Bogus}]}}}", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs cluster.Objects
			// The base YAML's Gateway is replaced by this one.
			base := strings.Replace(tenantYAML, "name: waypoint, namespace: shop", "name: unused, namespace: shop", 1)
			if errs := cluster.Decode("t.yaml", []byte(base+"---\n"+gateway(tc.allowed)+"---\n"+svc), &objs); len(errs) > 0 {
				t.Fatal(errs)
			}
			objs.Sort()
			res := Translate(LocalDefaults(), &objs, nil)
			a, ok := res.Addresses.Get("evil/grab.evil.svc.cluster.local")
			if !ok {
				t.Fatal("evil/grab not translated")
			}
			if got := a.GetService().GetWaypoint() != nil; got != tc.bound {
				t.Fatalf("bound = %v, want %v; warnings %q", got, tc.bound, res.Warnings)
			}
			refused := slices.ContainsFunc(res.Warnings, func(w string) bool {
				return strings.HasPrefix(w, "Service evil/grab: ") && strings.Contains(w, "waypoint shop/waypoint refuses")
			})
			if refused == tc.bound {
				t.Errorf("refusal warning present = %v, want %v: %q", refused, !tc.bound, res.Warnings)
			}
			if cart, _ := res.Addresses.Get("shop/cart.shop.svc.cluster.local"); (cart.GetService().GetWaypoint() != nil) != tc.cartBound {
				t.Errorf("shop/cart bound = %v, want %v", !tc.cartBound, tc.cartBound)
			}
		})
	}
}

// TestReferenceGrantChangeRebuildsRoutes: adding a ReferenceGrant is a
// route change for the incremental translator, so the waypoint configs
// are rebuilt and the granted backend resolves without any other change.
func TestReferenceGrantChangeRebuildsRoutes(t *testing.T) {
	before := tenantObjects(t, crossNamespaceRoute)
	grant := tenantObjects(t, `
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: allow-evil, namespace: shop}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: evil}]
  to: [{group: "", kind: Service}]
`).ReferenceGrants
	// The same objects (same pointers) plus the grant.
	after := *before
	after.ReferenceGrants = grant
	tr := NewTranslator(LocalDefaults())
	tr.Update(before, nil)
	_, ch := tr.Update(&after, nil)
	if !ch.Full && !ch.Routes {
		t.Fatalf("a new ReferenceGrant changed nothing the waypoint configs follow: %+v", ch)
	}
}
