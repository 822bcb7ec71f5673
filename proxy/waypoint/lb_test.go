package waypoint

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

func testCandidates(n int) []candidate {
	out := make([]candidate, n)
	for i := range out {
		out[i] = candidate{w: &state.Workload{UID: string(rune('a' + i)), Capacity: 1},
			addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), 80), st: &endpointStats{}}
	}
	return out
}

// TestChooseEndpoint: ROUND_ROBIN cycles through the endpoints in order;
// LEAST_REQUEST never picks the busier of two; RANDOM and the default
// spread over all of them.
func TestChooseEndpoint(t *testing.T) {
	rnd := func(n uint64) uint64 { return rand.Uint64N(n) }
	cands := testCandidates(3)
	p := &pool{}
	var got []string
	for range 6 {
		got = append(got, chooseEndpoint(waypointapi.LoadBalancer_ROUND_ROBIN, cands, p, rnd).w.UID)
	}
	if s := strings.Join(got, ""); s != "abcabc" {
		t.Errorf("round robin order %q, want abcabc", s)
	}
	two := testCandidates(2)
	two[0].st.active.Store(5)
	for range 50 {
		if c := chooseEndpoint(waypointapi.LoadBalancer_LEAST_REQUEST, two, p, rnd); c.w.UID != "b" {
			t.Fatalf("least request picked the busier endpoint %s", c.w.UID)
		}
	}
	for _, lb := range []waypointapi.LoadBalancer{waypointapi.LoadBalancer_RANDOM, waypointapi.LoadBalancer_LB_DEFAULT, waypointapi.LoadBalancer_LEAST_REQUEST} {
		seen := map[string]int{}
		for range 3000 {
			seen[chooseEndpoint(lb, cands, p, rnd).w.UID]++
		}
		for _, c := range cands {
			if n := seen[c.w.UID]; n < 800 || n > 1200 {
				t.Errorf("%s: %s picked %d of 3000 times, want about 1000", lb, c.w.UID, n)
			}
		}
	}
}

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

// TestPoolPrune: the state of endpoints that are gone is dropped once the
// pool holds more than twice the current ones; current ones keep theirs.
func TestPoolPrune(t *testing.T) {
	p := &pool{}
	var current []state.Endpoint
	for i := range 40 {
		uid := string(rune('A' + i))
		p.stats(uid).ejections.Store(1)
		if i < 4 {
			current = append(current, state.Endpoint{Workload: &state.Workload{UID: uid}})
		}
	}
	p.prune(current)
	if n := p.entries.Load(); n != 4 {
		t.Fatalf("%d entries after pruning, want the 4 current endpoints", n)
	}
	if p.stats("A").ejections.Load() != 1 {
		t.Error("a current endpoint lost its state")
	}
	p.prune(current[:1]) // 4 entries ≤ 2×1+16: nothing to do
	if n := p.entries.Load(); n != 4 {
		t.Errorf("pruned below the threshold: %d entries", n)
	}
}
