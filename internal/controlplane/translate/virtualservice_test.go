package translate

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// bookinfoYAML is the part of Istio's bookinfo that matters here: reviews
// (three versions) and ratings bound to a waypoint, in namespace default,
// where Istio's sample routing objects land (they name no namespace).
const bookinfoYAML = `
apiVersion: v1
kind: Namespace
metadata: {name: default, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: default, annotations: {ztunnel-go.io/waypoint-address: 10.96.9.1}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: default, labels: {istio.io/use-waypoint: waypoint}}
spec: {selector: {app: reviews}, clusterIP: 10.96.0.20, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: ratings, namespace: default, labels: {istio.io/use-waypoint: waypoint}}
spec: {selector: {app: ratings}, clusterIP: 10.96.0.21, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: details, namespace: default}
spec: {selector: {app: details}, clusterIP: 10.96.0.22, ports: [{name: http, port: 9080}]}
`

func bookinfoPod(name, app, version, ip string) string {
	return `---
apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: default, labels: {app: ` + app + `, version: ` + version + `}}
spec: {nodeName: node0, serviceAccountName: bookinfo-` + app + `, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: ` + ip + `}]}
`
}

// istioSample reads a file of Istio's samples/bookinfo/networking from the
// istio.io/istio module (never a dependency of ours: downloaded to the
// module cache only).
func istioSample(t *testing.T, name string) string {
	t.Helper()
	testkit.SkipShort(t, "the istio.io/istio module from the module proxy")
	out, err := exec.Command("go", "mod", "download", "-json", "istio.io/istio@latest").Output()
	if err != nil {
		t.Skipf("istio.io/istio module not available: %v", err)
	}
	_, rest, _ := strings.Cut(string(out), `"Dir": "`)
	dir, _, _ := strings.Cut(rest, `"`)
	b, err := os.ReadFile(filepath.Join(dir, "samples", "bookinfo", "networking", name))
	if err != nil {
		t.Fatal(err)
	}
	return "---\n" + string(b)
}

// bookinfoConfig translates bookinfo plus extra YAML and returns the
// waypoint's config and the statuses.
func bookinfoConfig(t *testing.T, extra ...string) (*waypointapi.Config, []PolicyStatus) {
	t.Helper()
	doc := bookinfoYAML + bookinfoPod("reviews-v1", "reviews", "v1", "10.0.0.1") +
		bookinfoPod("reviews-v2", "reviews", "v2", "10.0.0.2") + bookinfoPod("reviews-v3", "reviews", "v3", "10.0.0.3") +
		bookinfoPod("ratings-v1", "ratings", "v1", "10.0.0.4") + strings.Join(extra, "\n")
	var objs cluster.Objects
	if errs := cluster.Decode("bookinfo.yaml", []byte(doc), &objs); len(errs) > 0 {
		t.Fatalf("decode: %v", errs)
	}
	objs.Sort()
	cfg := Config{ClusterID: "Kubernetes"}
	res := Translate(cfg, &objs, nil)
	wps, st := WaypointConfigs(cfg, &objs, res)
	c := wps["default/waypoint"]
	if c == nil {
		t.Fatalf("no waypoint config: %v", wps)
	}
	return c, st
}

func serviceRoutes(t *testing.T, c *waypointapi.Config, name string) []*waypointapi.Route {
	t.Helper()
	for _, s := range c.GetServices() {
		if s.GetName() == name {
			return s.GetRoutes()
		}
	}
	t.Fatalf("service %s not bound: %v", name, c.GetServices())
	return nil
}

func statusOf(sts []PolicyStatus, kind, name string) PolicyStatus {
	for _, s := range sts {
		if s.Kind == kind && s.Name == name {
			return s
		}
	}
	return PolicyStatus{}
}

const reviewsHost = "reviews.default.svc.cluster.local"

// TestWaypointVirtualServiceBookinfo: Istio's own reviews 90/10 sample and
// destination-rule-all become one VirtualService route of the reviews
// service with two weighted subset backends, each naming the one pod of its
// version, and Istio's default retry policy; both objects say which
// waypoint applies them.
func TestWaypointVirtualServiceBookinfo(t *testing.T) {
	c, sts := bookinfoConfig(t, istioSample(t, "virtual-service-reviews-90-10.yaml"), istioSample(t, "destination-rule-all.yaml"))
	routes := serviceRoutes(t, c, "reviews")
	if len(routes) != 1 || routes[0].GetKind() != "VirtualService" || routes[0].GetName() != "reviews" || len(routes[0].GetRules()) != 1 {
		t.Fatalf("routes %v", routes)
	}
	rule := routes[0].GetRules()[0]
	want := []*waypointapi.Backend{
		{Hostname: reviewsHost, Namespace: "default", Weight: 90, Subset: "v1", SubsetLabels: map[string]string{"version": "v1"},
			SubsetWorkloads: []string{"Kubernetes//Pod/default/reviews-v1"}},
		{Hostname: reviewsHost, Namespace: "default", Weight: 10, Subset: "v2", SubsetLabels: map[string]string{"version": "v2"},
			SubsetWorkloads: []string{"Kubernetes//Pod/default/reviews-v2"}},
	}
	if len(rule.GetBackends()) != 2 || !proto.Equal(rule.GetBackends()[0], want[0]) || !proto.Equal(rule.GetBackends()[1], want[1]) {
		t.Fatalf("backends %v", rule.GetBackends())
	}
	if !proto.Equal(rule.GetRetry(), &waypointapi.Retry{Attempts: 2, Codes: []uint32{503}}) || len(rule.GetMatches()) != 0 {
		t.Fatalf("rule %v", rule)
	}
	vs, dr := statusOf(sts, "VirtualService", "default/reviews"), statusOf(sts, "DestinationRule", "default/reviews")
	for _, s := range []PolicyStatus{vs, dr} {
		if !s.Sent || !strings.HasPrefix(s.Message, EnforcedByWaypoint+"default/waypoint") || len(s.Invalid) > 0 {
			t.Errorf("status %+v", s)
		}
	}
	// ratings is bound but nothing routes to its subsets: its rule still
	// applies there. details is bound to no waypoint: its DestinationRule
	// has no effect, and says so.
	if r := statusOf(sts, "DestinationRule", "default/ratings"); !r.Sent || !strings.Contains(r.Message, "ratings.default.svc.cluster.local") {
		t.Errorf("ratings status %+v", r)
	}
	if d := statusOf(sts, "DestinationRule", "default/details"); d.Sent || !strings.Contains(d.Message, "not applied") {
		t.Errorf("details status %+v", d)
	}
}

// TestWaypointVirtualServiceMatchesAndFault: Istio's jason sample (header
// match, first match first) and the ratings abort and delay samples.
func TestWaypointVirtualServiceMatchesAndFault(t *testing.T) {
	c, _ := bookinfoConfig(t, istioSample(t, "virtual-service-reviews-jason-v2-v3.yaml"),
		istioSample(t, "virtual-service-ratings-test-abort.yaml"), istioSample(t, "destination-rule-all.yaml"))
	rules := serviceRoutes(t, c, "reviews")[0].GetRules()
	if len(rules) != 2 || len(rules[0].GetMatches()) != 1 ||
		!proto.Equal(rules[0].GetMatches()[0], &waypointapi.RouteMatch{Headers: []*waypointapi.HeaderMatch{{Name: "end-user", Value: "jason"}}}) ||
		rules[0].GetBackends()[0].GetSubset() != "v2" || rules[1].GetBackends()[0].GetSubset() != "v3" || len(rules[1].GetMatches()) != 0 {
		t.Fatalf("reviews rules %v", rules)
	}
	ratings := serviceRoutes(t, c, "ratings")[0].GetRules()
	if !proto.Equal(ratings[0].GetFault(), &waypointapi.Fault{AbortStatus: 500, AbortPercent: 100}) || ratings[1].GetFault() != nil {
		t.Fatalf("ratings rules %v", ratings)
	}
	if got := ratings[0].GetBackends()[0].GetSubsetWorkloads(); !slices.Equal(got, []string{"Kubernetes//Pod/default/ratings-v1"}) {
		t.Fatalf("ratings v1 workloads %v", got)
	}
	c, _ = bookinfoConfig(t, istioSample(t, "virtual-service-ratings-test-delay.yaml"), istioSample(t, "destination-rule-all.yaml"))
	if f := serviceRoutes(t, c, "ratings")[0].GetRules()[0].GetFault(); !proto.Equal(f, &waypointapi.Fault{DelayMs: 7000, DelayPercent: 100}) {
		t.Fatalf("delay fault %v", f)
	}
}

// TestWaypointVirtualServiceFailClosed: a subset referenced but not defined
// is marked (503 at the waypoint); a field the waypoint cannot enforce
// makes its rule answer 500 (no backends) and is named in the status with
// its field path; Istio's path prefix is a string prefix; uri regex and
// header prefix become anchored expressions.
func TestWaypointVirtualServiceFailClosed(t *testing.T) {
	c, sts := bookinfoConfig(t, istioSample(t, "destination-rule-all.yaml"), `---
apiVersion: networking.istio.io/v1beta1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  http:
  - match: [{uri: {prefix: /api}, headers: {x-v: {prefix: "2"}}}]
    delegate: {name: other}
    route: [{destination: {host: reviews, subset: v2}}]
  - match: [{uri: {regex: "/r/[0-9]+"}, ignoreUriCase: true}, {uri: {exact: /x}, gateways: [istio-system/ingress]}]
    timeout: 2s
    retries: {attempts: 3, perTryTimeout: 0.5s, retryOn: "gateway-error,connect-failure,no-such-condition"}
    mirror: {host: ratings}
    mirrorPercentage: {value: 12.5}
    route: [{destination: {host: reviews, subset: v9}}]
  - match: [{uri: {exact: /gw}, gateways: [istio-system/ingress]}]
    route: [{destination: {host: reviews}}]
`)
	rules := serviceRoutes(t, c, "reviews")[0].GetRules()
	if len(rules) != 2 {
		t.Fatalf("rules %v (the gateway-only rule must not apply to the mesh)", rules)
	}
	m := rules[0].GetMatches()[0]
	if rules[0].GetBackends() != nil || m.GetPath().GetValue() != "/api" || m.GetPath().GetType() != waypointapi.PathMatch_STRING_PREFIX ||
		!proto.Equal(m.GetHeaders()[0], &waypointapi.HeaderMatch{Name: "x-v", Value: "2.*", Regex: true}) {
		t.Fatalf("rule 0 %v", rules[0])
	}
	r1 := rules[1]
	if len(r1.GetMatches()) != 1 || r1.GetMatches()[0].GetPath().GetValue() != "(?i)(?:/r/[0-9]+)" || r1.GetTimeoutMs() != 2000 ||
		!proto.Equal(r1.GetRetry(), &waypointapi.Retry{Attempts: 3, PerTryTimeoutMs: 500, Codes: []uint32{502, 503, 504}}) ||
		len(r1.GetMirrors()) != 1 || r1.GetMirrors()[0].GetPercent() != 13 || r1.GetMirrors()[0].GetBackend().GetHostname() != "ratings.default.svc.cluster.local" ||
		len(r1.GetBackends()) != 1 || !r1.GetBackends()[0].GetMissingSubset() {
		t.Fatalf("rule 1 %v", r1)
	}
	st := statusOf(sts, "VirtualService", "default/reviews")
	if !slices.ContainsFunc(st.Invalid, func(s string) bool { return strings.HasPrefix(s, "spec.http[0].delegate: ") }) || len(st.Invalid) != 1 ||
		!strings.Contains(st.Message, "spec.http[1].retries.retryOn: no-such-condition") {
		t.Fatalf("status %+v", st)
	}
}

// TestVirtualServiceRedirectRewrite: rewrite (uri on a prefix match, on no
// uri match, uriRegexRewrite with Envoy's \1, authority), redirect (uri,
// authority, derivePort, default 301), directResponse, headers.response
// and per-destination headers, and match.port reach the waypoint's config.
func TestVirtualServiceRedirectRewrite(t *testing.T) {
	c, sts := bookinfoConfig(t, istioSample(t, "destination-rule-all.yaml"), `---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews]
  http:
  - match: [{uri: {prefix: /ratings}, port: 9080}]
    rewrite: {uri: /v1/bookRatings, authority: ratings.example}
    headers: {response: {set: {x-r: "1"}, remove: [server]}}
    route:
    - destination: {host: reviews, subset: v1}
      headers: {request: {add: {x-d: v1}}, response: {set: {x-dr: v1}}}
  - match: [{uri: {prefix: /z2m/}}]
    rewrite: {uriRegexRewrite: {match: "/z2m(/|$)(.*)", rewrite: "/\\2"}}
    route: [{destination: {host: reviews, subset: v2}}]
  - match: [{uri: {exact: /old}}]
    redirect: {uri: /new, authority: example.org, derivePort: FROM_REQUEST_PORT}
  - match: [{uri: {exact: /teapot}}]
    directResponse: {status: 418, body: {string: short and stout}}
    corsPolicy:
      allowOrigins: [{exact: "https://a.example"}, {prefix: "https://b."}, {regex: "https://.*[.]c[.]example"}]
      allowOrigin: ["*"]
      allowMethods: [GET, POST]
      maxAge: 24h
      allowCredentials: true
      unmatchedPreflights: IGNORE
  - rewrite: {uri: /v2}
    route: [{destination: {host: reviews, subset: v3}}]
`)
	rules := serviceRoutes(t, c, "reviews")[0].GetRules()
	if len(rules) != 5 {
		t.Fatalf("rules %v", rules)
	}
	r0 := rules[0]
	if !proto.Equal(r0.GetMatches()[0], &waypointapi.RouteMatch{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_STRING_PREFIX, Value: "/ratings"}, Port: 9080}) ||
		!proto.Equal(r0.GetRewrite(), &waypointapi.Rewrite{Host: "ratings.example", Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_STRING_PREFIX, Value: "/v1/bookRatings"}}) ||
		!proto.Equal(r0.GetResponseHeaderModifiers()[0], &waypointapi.HeaderModifier{Set: map[string]string{"x-r": "1"}, Remove: []string{"server"}}) ||
		len(r0.GetBackends()) != 1 || !proto.Equal(r0.GetBackends()[0].GetRequestHeaderModifiers()[0], &waypointapi.HeaderModifier{Add: map[string]string{"x-d": "v1"}}) ||
		!proto.Equal(r0.GetBackends()[0].GetResponseHeaderModifiers()[0], &waypointapi.HeaderModifier{Set: map[string]string{"x-dr": "v1"}}) {
		t.Errorf("rule 0 %v", r0)
	}
	if want := (&waypointapi.PathModifier{Type: waypointapi.PathModifier_REGEX, Pattern: "/z2m(/|$)(.*)", Value: "/${2}"}); !proto.Equal(rules[1].GetRewrite().GetPath(), want) {
		t.Errorf("rule 1 rewrite %v", rules[1].GetRewrite())
	}
	if want := (&waypointapi.Redirect{Host: "example.org", Code: 301, PortRule: waypointapi.Redirect_REQUEST_PORT,
		Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_FULL, Value: "/new"}}); !proto.Equal(rules[2].GetRedirect(), want) || rules[2].GetBackends() != nil {
		t.Errorf("rule 2 %v", rules[2])
	}
	if want := (&waypointapi.DirectResponse{Status: 418, Body: []byte("short and stout")}); !proto.Equal(rules[3].GetDirectResponse(), want) {
		t.Errorf("rule 3 %v", rules[3])
	}
	if want := (&waypointapi.Cors{AllowOrigins: []string{".*", `https://a\.example`, `https://b\..*`, "https://.*[.]c[.]example"},
		AllowMethods: []string{"GET", "POST"}, MaxAgeS: 86400, AllowCredentials: true, UnmatchedPreflight: waypointapi.Cors_ANSWER}); !proto.Equal(rules[3].GetCors(), want) {
		t.Errorf("rule 3 cors %v", rules[3].GetCors())
	}
	// No uri match: Envoy's prefix "/" is what the prefix rewrite replaces.
	if m := rules[4].GetMatches(); len(m) != 1 || !proto.Equal(m[0].GetPath(), &waypointapi.PathMatch{Type: waypointapi.PathMatch_STRING_PREFIX, Value: "/"}) ||
		len(rules[4].GetBackends()) != 1 {
		t.Errorf("rule 4 %v", rules[4])
	}
	if st := statusOf(sts, "VirtualService", "default/reviews"); len(st.Invalid) != 0 || !st.Sent {
		t.Errorf("status %+v", st)
	}
	// A redirect code that is not one fails closed.
	c, sts = bookinfoConfig(t, `---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews]
  http: [{redirect: {uri: /x, redirectCode: 200}}]
`)
	if r := serviceRoutes(t, c, "reviews")[0].GetRules()[0]; r.GetRedirect() != nil || r.GetBackends() != nil {
		t.Errorf("bad redirect %v", r)
	}
	if st := statusOf(sts, "VirtualService", "default/reviews"); len(st.Invalid) != 1 || !strings.HasPrefix(st.Invalid[0], "spec.http[0].redirect.redirectCode: ") {
		t.Errorf("status %+v", st)
	}
}

// TestWaypointVirtualServicePrecedence: an HTTPRoute attached to the
// service takes precedence over a VirtualService for it (Istio leaves the
// mix undefined); the VirtualService's status names the route. The
// DestinationRule's traffic policy still applies to the HTTPRoute's
// backends.
func TestWaypointVirtualServicePrecedence(t *testing.T) {
	c, sts := bookinfoConfig(t, istioSample(t, "virtual-service-reviews-90-10.yaml"), `---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: reviews-gamma, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews}]
  rules: [{backendRefs: [{name: reviews, port: 9080}]}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN}
    outlierDetection: {consecutive5xxErrors: 2, interval: 1s, baseEjectionTime: 5s, maxEjectionPercent: 50}
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
`)
	routes := serviceRoutes(t, c, "reviews")
	if len(routes) != 1 || routes[0].GetName() != "reviews-gamma" {
		t.Fatalf("routes %v", routes)
	}
	want := &waypointapi.TrafficPolicy{LoadBalancer: waypointapi.LoadBalancer_ROUND_ROBIN, OutlierDetection: &waypointapi.OutlierDetection{
		ConsecutiveServerErrors: 2, IntervalMs: 1000, BaseEjectionTimeMs: 5000, MaxEjectionPercent: 50,
	}, Locality: &waypointapi.LocalityLb{}}
	if tp := routes[0].GetRules()[0].GetBackends()[0].GetTrafficPolicy(); !proto.Equal(tp, want) {
		t.Fatalf("traffic policy %v", tp)
	}
	if st := statusOf(sts, "VirtualService", "default/reviews"); st.Sent || !strings.Contains(st.Message, "Gateway API routes take precedence") ||
		!strings.Contains(st.Message, "reviews-gamma") {
		t.Fatalf("status %+v", st)
	}
}

// TestWaypointDestinationRuleOnly: a DestinationRule with a traffic policy
// on a service with no route gives it a catch-all route to itself carrying
// the policy (with outlier detection, Istio's default locality failover);
// a policy field the waypoint cannot enforce (tcp.tcpKeepalive) makes it
// answer 500 and is reported.
func TestWaypointDestinationRuleOnly(t *testing.T) {
	c, sts := bookinfoConfig(t, `---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: default}
spec:
  host: ratings.default.svc.cluster.local
  trafficPolicy: {loadBalancer: {simple: LEAST_CONN}, outlierDetection: {consecutiveGatewayErrors: 3}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy: {connectionPool: {tcp: {maxConnections: 1, tcpKeepalive: {probes: 3}}}}
`)
	r := serviceRoutes(t, c, "ratings")
	want := &waypointapi.Backend{Hostname: "ratings.default.svc.cluster.local", Namespace: "default", Weight: 1,
		TrafficPolicy: &waypointapi.TrafficPolicy{LoadBalancer: waypointapi.LoadBalancer_LEAST_REQUEST, OutlierDetection: &waypointapi.OutlierDetection{
			ConsecutiveServerErrors: 5, ConsecutiveGatewayErrors: 3, IntervalMs: 10000, BaseEjectionTimeMs: 30000, MaxEjectionPercent: 10,
		}, Locality: &waypointapi.LocalityLb{}}}
	if len(r) != 1 || r[0].GetKind() != "DestinationRule" || !proto.Equal(r[0].GetRules()[0].GetBackends()[0], want) {
		t.Fatalf("ratings routes %v", r)
	}
	r = serviceRoutes(t, c, "reviews")
	if len(r) != 1 || r[0].GetRules()[0].GetBackends() != nil {
		t.Fatalf("reviews routes %v: an unenforceable policy must answer 500", r)
	}
	if st := statusOf(sts, "DestinationRule", "default/reviews"); len(st.Invalid) != 1 || !strings.HasPrefix(st.Invalid[0], "spec.trafficPolicy.connectionPool.tcp.tcpKeepalive: ") {
		t.Fatalf("status %+v", st)
	}
}

// TestWaypointRoutesChangeIncrementally: a VirtualService change, and a pod
// change while DestinationRules exist (a subset's members follow pod
// labels) or a VirtualService matches sourceLabels, mark Changes.Routes so that waypoint configs are rebuilt; a pod
// change without any DestinationRule does not.
func TestWaypointRoutesChangeIncrementally(t *testing.T) {
	decode := func(doc string) *cluster.Objects {
		var objs cluster.Objects
		if errs := cluster.Decode("b.yaml", []byte(doc), &objs); len(errs) > 0 {
			t.Fatalf("decode: %v", errs)
		}
		objs.Sort()
		return &objs
	}
	base := bookinfoYAML + bookinfoPod("reviews-v1", "reviews", "v1", "10.0.0.1")
	more := base + bookinfoPod("reviews-v2", "reviews", "v2", "10.0.0.2")
	dr := "---\n" + `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec: {host: reviews, subsets: [{name: v2, labels: {version: v2}}]}
`
	vs := "---\n" + `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews, subset: v2}}]}]}
`
	srcVS := "---\n" + `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec: {hosts: [reviews], http: [{match: [{sourceLabels: {app: productpage}}], route: [{destination: {host: ratings}}]}, {route: [{destination: {host: reviews}}]}]}
`
	for _, c := range []struct {
		name, from, to string
		want           bool
	}{
		{"pod without DestinationRules", base, more, false},
		{"pod with a DestinationRule", base + dr, more + dr, true},
		{"VirtualService added", base + dr, base + dr + vs, true},
		{"pod with a sourceLabels VirtualService", base + srcVS, more + srcVS, true},
	} {
		tr := NewTranslator(Config{ClusterID: "Kubernetes"})
		from, to := decode(c.from), decode(c.to)
		// Unchanged objects are the same objects, as a source publishes them.
		to.Namespaces, to.Services, to.Gateways = from.Namespaces, from.Services, from.Gateways
		if len(to.Pods) == len(from.Pods) {
			to.Pods = from.Pods
		}
		if len(to.DestinationRules) == len(from.DestinationRules) {
			to.DestinationRules = from.DestinationRules
		}
		if len(to.VirtualServices) == len(from.VirtualServices) {
			to.VirtualServices = from.VirtualServices
		}
		tr.Update(from, nil)
		if _, ch := tr.Update(to, nil); ch.Full || ch.Routes != c.want {
			t.Errorf("%s: full %v (%s) routes %v, want routes %v", c.name, ch.Full, ch.Reason, ch.Routes, c.want)
		}
	}
}

// TestWaypointExportTo: a VirtualService or DestinationRule applies at a
// waypoint only when exported to the waypoint's namespace (here default):
// team's VirtualService exported to "." is not applied, the one exported
// to default is; a DestinationRule of default exported only to team is not
// applied by default's own waypoint.
func TestWaypointExportTo(t *testing.T) {
	vs := func(name, exportTo string) string {
		return `---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ` + name + `, namespace: team, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  hosts: [reviews.default.svc.cluster.local]
  exportTo: ` + exportTo + `
  http: [{match: [{headers: {x-team: {exact: ` + name + `}}}], route: [{destination: {host: reviews.default.svc.cluster.local}}]}]
`
	}
	c, _ := bookinfoConfig(t, vs("private", `["."]`), vs("shared", `["default"]`), `---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: default}
spec:
  host: ratings.default.svc.cluster.local
  exportTo: [team]
  trafficPolicy: {loadBalancer: {simple: LEAST_CONN}}
`)
	var names []string
	for _, r := range serviceRoutes(t, c, "reviews") {
		names = append(names, r.GetKind()+" "+r.GetNamespace()+"/"+r.GetName())
	}
	if !slices.Equal(names, []string{"VirtualService team/shared"}) {
		t.Errorf("reviews routes at default/waypoint: %v, want only team/shared", names)
	}
	if r := serviceRoutes(t, c, "ratings"); len(r) != 0 {
		t.Errorf("ratings routes %v: a DestinationRule not exported to default applied there", r)
	}
}
