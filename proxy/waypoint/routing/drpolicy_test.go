package routing

import (
	"context"
	"errors"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// TestConsistentHash: for ring hash and Maglev, one key always picks one
// endpoint, keys spread over every endpoint, and removing one endpoint
// moves its keys and few others.
func TestConsistentHash(t *testing.T) {
	for _, maglev := range []bool{false, true} {
		hp := compileHash(&waypointapi.ConsistentHash{Key: waypointapi.ConsistentHash_HEADER, Name: "x-user", Maglev: maglev, TableSize: 1024})
		if maglev {
			hp = compileHash(&waypointapi.ConsistentHash{Key: waypointapi.ConsistentHash_HEADER, Name: "x-user", Maglev: true})
		}
		cands := testCandidates(5)
		p := &pool{}
		before := map[int]string{}
		seen := map[string]int{}
		for k := range 2000 {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-User", "user-"+strconv.Itoa(k))
			key, set := hp.keyOf(r, netip.AddrPort{}, netip.AddrPort{})
			if !key.ok || set != "" {
				t.Fatalf("key %v %q", key, set)
			}
			uid := p.byHash(hp, cands, key.h).w.UID
			if again := p.byHash(hp, cands, key.h).w.UID; again != uid {
				t.Fatalf("maglev=%v: key %d picked %s then %s", maglev, k, uid, again)
			}
			before[k] = uid
			seen[uid]++
		}
		for _, c := range cands {
			if n := seen[c.w.UID]; n < 200 {
				t.Errorf("maglev=%v: %s got %d of 2000 keys", maglev, c.w.UID, n)
			}
		}
		gone := cands[2].w.UID
		rest := append(append([]candidate{}, cands[:2]...), cands[3:]...)
		moved := 0
		for k, uid := range before {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-User", "user-"+strconv.Itoa(k))
			key, _ := hp.keyOf(r, netip.AddrPort{}, netip.AddrPort{})
			now := p.byHash(hp, rest, key.h).w.UID
			if uid != gone && now != uid {
				moved++
			}
		}
		// Both move a few keys besides the gone endpoint's: Maglev's
		// permutations refill, and the ring (as Envoy's) gives each
		// endpoint ceil(size/n) points, more when n shrinks.
		if moved > 2000/8 {
			t.Errorf("maglev=%v: %d keys of remaining endpoints moved", maglev, moved)
		}
	}
}

// TestHashCookie: a cookie key without the cookie and with a ttl generates
// one (Set-Cookie, as Envoy), and the same client gets the same value.
func TestHashCookie(t *testing.T) {
	hp := compileHash(&waypointapi.ConsistentHash{Key: waypointapi.ConsistentHash_COOKIE, Name: "sticky", CookiePath: "/",
		CookieTtlSet: true, CookieTtlMs: 60000})
	src, dst := netip.MustParseAddrPort("10.0.0.1:5000"), netip.MustParseAddrPort("10.96.0.1:80")
	k1, set := hp.keyOf(httptest.NewRequest("GET", "/", nil), src, dst)
	if !k1.ok || set == "" {
		t.Fatalf("no cookie generated: %v %q", k1, set)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Cookie", set[:len(set)-len("; Max-Age=60; Path=/; HttpOnly")])
	k2, set2 := hp.keyOf(r, src, dst)
	if k2 != k1 || set2 != "" {
		t.Errorf("with the cookie %q: key %v (want %v), set %q", r.Header.Get("Cookie"), k2, k1, set2)
	}
	noTTL := compileHash(&waypointapi.ConsistentHash{Key: waypointapi.ConsistentHash_COOKIE, Name: "sticky"})
	if k, set := noTTL.keyOf(httptest.NewRequest("GET", "/", nil), src, dst); k.ok || set != "" {
		t.Errorf("without ttl: %v %q, want no key and no cookie", k, set)
	}
}

// TestLocalityFailover: endpoints of the waypoint's own zone take all
// traffic; with them ejected it goes to the failover region before the
// others; distribute weighs localities.
func TestLocalityFailover(t *testing.T) {
	self := &state.Workload{Locality: state.Locality{Region: "r1", Zone: "z1"}}
	mk := func(uid, region, zone string, ejected bool) candidate {
		return candidate{w: &state.Workload{UID: uid, Capacity: 1, Locality: state.Locality{Region: region, Zone: zone}}, st: &endpointStats{}, ejected: ejected}
	}
	lp := compileLocality(&waypointapi.LocalityLb{Failover: []*waypointapi.LocalityFailover{{From: "r1", To: "r3"}}})
	cases := []struct {
		cands []candidate
		want  string
	}{
		{[]candidate{mk("local", "r1", "z1", false), mk("zone2", "r1", "z2", false), mk("r3", "r3", "z", false)}, "local"},
		{[]candidate{mk("local", "r1", "z1", true), mk("r2", "r2", "z", false), mk("r3", "r3", "z", false)}, "r3"},
		{[]candidate{mk("local", "r1", "z1", true), mk("zone2", "r1", "z2", false), mk("r3", "r3", "z", false)}, "zone2"},
	}
	for i, tc := range cases {
		for n := range uint64(20) {
			got := lp.narrow(self, tc.cands, hashKey{}, func(m uint64) uint64 { return (n * 7) % m })
			if len(got) != 1 || got[0].w.UID != tc.want {
				t.Errorf("case %d: %v, want only %s", i, uids(got), tc.want)
			}
		}
	}
	dist := compileLocality(&waypointapi.LocalityLb{Distribute: []*waypointapi.LocalityDistribute{{From: "r1/*", To: map[string]uint32{"r1/z1": 80, "r2/*": 20}}}})
	cands := []candidate{mk("a", "r1", "z1", false), mk("b", "r2", "z", false), mk("c", "r3", "z", false)}
	seen := map[string]int{}
	for n := range uint64(1000) {
		for _, c := range dist.narrow(self, cands, hashKey{}, func(m uint64) uint64 { return (n * 997) % m }) {
			seen[c.w.UID]++
		}
	}
	if seen["c"] != 0 || seen["a"] < 700 || seen["a"] > 900 || seen["b"] < 100 || seen["b"] > 300 {
		t.Errorf("distribute 80/20: %v", seen)
	}
}

func uids(cs []candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.w.UID)
	}
	return out
}

// TestCircuitBreaker: http2MaxRequests refuses the attempt over it with
// 503 UO; a released attempt frees its place; maxRetries bounds retries in
// flight.
func TestCircuitBreaker(t *testing.T) {
	l := compileLimits(&waypointapi.ConnectionPool{MaxRequests: 2, MaxRetries: 1})
	var cb breaker
	p := &pool{}
	for range 2 {
		if err := cb.admitRequest(l, "h"); err != nil {
			t.Fatal(err)
		}
	}
	err := cb.admitRequest(l, "h")
	var nr *stream.Refusal
	if !errors.As(err, &nr) || nr.Code != 503 || nr.Flag != "UO" || nr.Body != OverflowBody {
		t.Fatalf("third request: %v, want 503 UO", err)
	}
	cb.requests.Add(-1)
	if err := cb.admitRequest(l, "h"); err != nil {
		t.Errorf("after a release: %v", err)
	}
	var rt Router
	prev := &Picked{pool: p, limits: l}
	ok1, rel := rt.RetryAdmit(prev)
	ok2, _ := rt.RetryAdmit(prev)
	if !ok1 || ok2 {
		t.Fatalf("retries admitted %v %v, want the first only", ok1, ok2)
	}
	rel()
	if ok, _ := rt.RetryAdmit(prev); !ok {
		t.Error("a retry after the first ended was refused")
	}
}

// TestCircuitBreakerPending: with maxConnections 1 and
// http1MaxPendingRequests 1, a second attempt waits for the connection, a
// third overflows (UO), and the waiting one proceeds once the first is
// released.
func TestCircuitBreakerPending(t *testing.T) {
	l := compileLimits(&waypointapi.ConnectionPool{MaxConnections: 1, MaxPendingRequests: 1})
	p := &pool{}
	var rt Router
	first, second, third := &Picked{pool: p, limits: l}, &Picked{pool: p, limits: l}, &Picked{pool: p, limits: l}
	if err := rt.Acquire(context.Background(), first, "h", false); err != nil {
		t.Fatal(err)
	}
	if err := rt.Acquire(context.Background(), &Picked{pool: p, limits: l}, "h", true); err != nil {
		t.Errorf("an HTTP/2 stream waited for a connection: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- rt.Acquire(context.Background(), second, "h", false) }()
	for p.cb.pending.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	var nr *stream.Refusal
	if err := rt.Acquire(context.Background(), third, "h", false); !errors.As(err, &nr) || nr.Flag != "UO" {
		t.Fatalf("third attempt: %v, want an overflow", err)
	}
	first.Release()
	if err := <-got; err != nil {
		t.Fatalf("the pending attempt: %v", err)
	}
	second.Release()
	if n := len(p.cb.slots); n != 0 {
		t.Errorf("%d connections held after every release", n)
	}
}
