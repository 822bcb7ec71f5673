package routing

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
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
