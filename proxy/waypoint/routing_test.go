package waypoint

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// faultAbortBody is what Envoy's fault filter answers on abort.
const faultAbortBody = "fault filter abort"

// subsetLab is the lab with both backend pods in service "server", so a
// DestinationRule subset (by workload uid) is what tells them apart.
func subsetLab(t *testing.T, routes ...*waypointapi.Route) *lab {
	cfg := baseConfig()
	cfg.Services[0].Routes = routes
	l := newLab(t, cfg)
	proxytest.Apply(t, l.w.sink.Store,
		proxytest.Pod("demo", "server-v2", v2IP, proxytest.ServiceAccount("sa-v2"),
			proxytest.InService(proxytest.ServiceKey("demo", "server"), 80, 8080, 9000, 9000),
			proxytest.InService(proxytest.ServiceKey("demo", "server-v2"), 80, 8080)))
	return l
}

func subsetBackend(subset string, weight uint32, uids ...string) *waypointapi.Backend {
	return &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: weight,
		Subset: subset, SubsetLabels: map[string]string{"version": subset}, SubsetWorkloads: uids}
}

// TestVirtualServiceSubsets: a VirtualService route splits 90/10 between
// two subsets of one service (each backend names its subset's workload),
// its rules are tried in order (the first match wins, even over a more
// specific later one), and a subset referenced but not defined answers 503.
func TestVirtualServiceSubsets(t *testing.T) {
	v1, v2 := proxytest.UID("demo", "server-v1"), proxytest.UID("demo", "server-v2")
	l := subsetLab(t, &waypointapi.Route{Name: "reviews", Namespace: "demo", Kind: "VirtualService", Rules: []*waypointapi.RouteRule{
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_REGULAR_EXPRESSION, Value: "/missing.*"}}},
			Backends: []*waypointapi.Backend{{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: 1, Subset: "v9", MissingSubset: true}}},
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_REGULAR_EXPRESSION, Value: "/api.*"}}},
			Backends: []*waypointapi.Backend{subsetBackend("v1", 90, v1), subsetBackend("v2", 10, v2)}},
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_EXACT, Value: "/api/v2"}}},
			Backends: []*waypointapi.Backend{subsetBackend("v2", 1, v2)}},
		{Backends: []*waypointapi.Backend{subsetBackend("v2", 1, v2)}},
	}})
	c := l.client(clientID, clientIP)
	const n = 1000
	for i := range n {
		if code, body := get(t, c, "/api/items"); code != 200 {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	share := float64(l.hits[0].Load()) / n
	t.Logf("subset v1 %.3f v2 %.3f", share, 1-share)
	if share < 0.87 || share > 0.93 {
		t.Errorf("v1 share %.3f, want 0.90 ± 0.03", share)
	}
	before := l.hits[0].Load()
	for range 20 {
		// /api/v2 is an exact match of a later rule; the earlier /api.* wins.
		get(t, c, "/api/v2")
		if code, body := get(t, c, "/other"); code != 200 || !strings.HasPrefix(body, "v2 ") {
			t.Fatalf("catch-all rule: %d %q, want subset v2", code, body)
		}
	}
	if l.hits[0].Load() == before {
		t.Error("/api/v2 never reached subset v1: the first matching rule must win")
	}
	if code, _ := get(t, c, "/missing"); code != 503 {
		t.Errorf("undefined subset answered %d, want 503", code)
	}
	// A subset whose workloads are all gone (or unhealthy) has no upstream.
	l.setConfig(func() *waypointapi.Config {
		cfg := baseConfig()
		cfg.Services[0].Routes = []*waypointapi.Route{{Name: "r", Namespace: "demo", Kind: "VirtualService",
			Rules: []*waypointapi.RouteRule{{Backends: []*waypointapi.Backend{subsetBackend("v3", 1)}}}}}
		return cfg
	}())
	// A new connection: a tunnel keeps the config it was accepted with.
	if code, _ := get(t, l.client(clientID, clientIP), "/"); code != 503 {
		t.Errorf("empty subset answered %d, want 503", code)
	}
}

// TestMirrorSubset: a mirror to a DestinationRule subset goes to that
// subset's workload, not to any endpoint of the host.
func TestMirrorSubset(t *testing.T) {
	v1, v2 := proxytest.UID("demo", "server-v1"), proxytest.UID("demo", "server-v2")
	mb := subsetBackend("v2", 0, v2)
	l := subsetLab(t, &waypointapi.Route{Name: "m", Namespace: "demo", Kind: "VirtualService", Rules: []*waypointapi.RouteRule{{
		Backends: []*waypointapi.Backend{subsetBackend("v1", 1, v1)},
		Mirrors:  []*waypointapi.Mirror{{Backend: mb, Percent: 100}},
	}}})
	c := l.client(clientID, clientIP)
	for range 10 {
		if code, body := get(t, c, "/m"); code != 200 || !strings.HasPrefix(body, "v1 ") {
			t.Fatalf("GET /m = %d %q, want subset v1", code, body)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.hits[1].Load() < 10 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := l.hits[1].Load(); n != 10 {
		t.Fatalf("subset v2 got %d mirrored requests, want 10", n)
	}
	if last := l.last[1].Load(); last == nil || !strings.HasPrefix(*last, "server.demo.svc.cluster.local-shadow") {
		t.Errorf("mirrored request %v, want Host ...-shadow", last)
	}
}

// TestOutlierEjection: the endpoint that answers 5xx is ejected after
// consecutive5xxErrors and every later request goes to the other one; once
// its ejection time is over it is picked again.
func TestOutlierEjection(t *testing.T) {
	backend := &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: 1,
		TrafficPolicy: &waypointapi.TrafficPolicy{LoadBalancer: waypointapi.LoadBalancer_ROUND_ROBIN,
			OutlierDetection: &waypointapi.OutlierDetection{ConsecutiveServerErrors: 3, IntervalMs: 100, BaseEjectionTimeMs: 1500, MaxEjectionPercent: 50}}}
	l := subsetLab(t, &waypointapi.Route{Name: "server", Namespace: "demo", Kind: "DestinationRule",
		Rules: []*waypointapi.RouteRule{{Backends: []*waypointapi.Backend{backend}}}})
	c := l.client(clientID, clientIP)
	l.fail503.Store(1 << 30) // v1 answers 503 from now on
	codes := map[int]int{}
	for range 40 {
		code, _ := get(t, c, "/")
		codes[code]++
	}
	// Round robin: v1's first three requests fail, then it is ejected.
	if codes[503] != 3 || codes[200] != 37 {
		t.Fatalf("answers %v, want 3×503 (until ejection) and 37×200 from v2", codes)
	}
	l.fail503.Store(0)
	time.Sleep(1600 * time.Millisecond)
	before := l.hits[0].Load()
	for range 10 {
		if code, body := get(t, c, "/"); code != 200 || !strings.HasPrefix(body, "v") {
			t.Fatalf("after the ejection: %d %q", code, body)
		}
	}
	if l.hits[0].Load() == before {
		t.Error("v1 was not picked again after its ejection time")
	}
}

// TestFaultInjection: Istio's ratings test samples at the waypoint: a
// header-matched abort answers its status with Envoy's body without
// reaching a backend, a fixed delay holds the request that long, and
// requests the fault rule does not match pass untouched.
func TestFaultInjection(t *testing.T) {
	server := &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: 1}
	l := subsetLab(t, &waypointapi.Route{Name: "ratings", Namespace: "demo", Kind: "VirtualService", Rules: []*waypointapi.RouteRule{
		{Matches: []*waypointapi.RouteMatch{{Headers: []*waypointapi.HeaderMatch{{Name: "end-user", Value: "jason"}}}},
			Fault: &waypointapi.Fault{AbortStatus: 418, AbortPercent: 100}, Backends: []*waypointapi.Backend{server}},
		{Matches: []*waypointapi.RouteMatch{{Headers: []*waypointapi.HeaderMatch{{Name: "end-user", Value: "slow"}}}},
			Fault: &waypointapi.Fault{DelayMs: 300, DelayPercent: 100}, Backends: []*waypointapi.Backend{server}},
		{Backends: []*waypointapi.Backend{server}},
	}})
	c := l.client(clientID, clientIP)
	before := l.hits[0].Load() + l.hits[1].Load()
	if code, body := get(t, c, "/ratings/0", "end-user", "jason"); code != http.StatusTeapot || body != faultAbortBody+"\n" {
		t.Fatalf("abort: %d %q", code, body)
	}
	if l.hits[0].Load()+l.hits[1].Load() != before {
		t.Error("an aborted request reached a backend")
	}
	start := time.Now()
	if code, _ := get(t, c, "/ratings/0", "end-user", "slow"); code != 200 || time.Since(start) < 300*time.Millisecond {
		t.Errorf("delay: %d after %v, want 200 after ≥ 300ms", code, time.Since(start))
	}
	start = time.Now()
	if code, _ := get(t, c, "/ratings/0", "end-user", "other"); code != 200 || time.Since(start) > 250*time.Millisecond {
		t.Errorf("no fault: %d after %v", code, time.Since(start))
	}
}
