package route

import (
	"errors"
	"math"
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// weighted sets a service's weighted_waypoints, alternating a waypoint
// service name (namespace apps) and its weight.
func weighted(entries ...any) pt.ServiceOpt {
	return func(s *workloadapi.Service) {
		for i := 0; i+1 < len(entries); i += 2 {
			s.WeightedWaypoints = append(s.WeightedWaypoints, &workloadapi.WeightedWaypoint{
				Destination: pt.WaypointHost("apps", entries[i].(string)),
				Weight:      uint32(entries[i+1].(int)),
			})
		}
	}
}

// canaryMesh: service "canary" splits 3:1 between waypoints "wp-stable"
// and "wp-canary", and lists "wp-off" at weight 0; its primary waypoint
// is wp-stable, as istiod keeps it for dataplanes without the field.
func canaryMesh(t testing.TB) *state.Snapshot {
	s := state.NewStore()
	k := pt.ServiceKey
	primary := pt.ServiceWaypoint(pt.WaypointHost("apps", "wp-stable"))
	pt.Apply(t, s,
		pt.Pod("apps", "client", "10.0.0.1"),
		pt.Pod("apps", "backend", "10.0.1.1", pt.InService(k("apps", "canary"), 80, 8080),
			pt.InService(k("apps", "zero"), 80, 8080), pt.InService(k("apps", "broken"), 80, 8080),
			pt.InService(k("apps", "plain"), 80, 8080)),
		pt.Pod("apps", "stable-1", "10.0.3.1", pt.ServiceAccount("wp-stable"), pt.InService(k("apps", "wp-stable"), 15008, 15008)),
		pt.Pod("apps", "canary-1", "10.0.3.2", pt.ServiceAccount("wp-canary"), pt.InService(k("apps", "wp-canary"), 15008, 15008)),
		pt.Pod("apps", "off-1", "10.0.3.3", pt.ServiceAccount("wp-off"), pt.InService(k("apps", "wp-off"), 15008, 15008)),
		pt.Service("apps", "wp-stable", "10.96.1.1", []uint32{15008, 15008}),
		pt.Service("apps", "wp-canary", "10.96.1.2", []uint32{15008, 15008}),
		pt.Service("apps", "wp-off", "10.96.1.3", []uint32{15008, 15008}),
		pt.Service("apps", "canary", "10.96.0.1", []uint32{80, 8080}, primary,
			weighted("wp-stable", 3, "wp-canary", 1, "wp-off", 0)),
		pt.Service("apps", "zero", "10.96.0.2", []uint32{80, 8080}, primary,
			weighted("wp-canary", 0, "wp-off", 0)),
		pt.Service("apps", "broken", "10.96.0.3", []uint32{80, 8080}, primary,
			weighted("wp-stable", 1, "wp-missing", 1)),
		pt.Service("apps", "plain", "10.96.0.4", []uint32{80, 8080}, primary),
	)
	return s.Load()
}

// TestRouteWeightedWaypointsSplit draws many real-random decisions and
// checks each waypoint's share lies within 5 standard deviations of
// weight/sum (a false failure is a 1-in-a-million event), and that the
// weight-0 entry gets nothing.
func TestRouteWeightedWaypointsSplit(t *testing.T) {
	snap := canaryMesh(t)
	client := snap.WorkloadByUID(pt.UID("apps", "client"))
	dst := netip.MustParseAddrPort("10.96.0.1:80")
	const n = 20000
	counts := map[string]int{}
	for range n {
		r, err := Outbound(snap, client, dst)
		if err != nil {
			t.Fatal(err)
		}
		if r.Kind != HBONE || !r.Waypoint || r.Authority != dst || r.Service == nil || r.Service.Name != "canary" {
			t.Fatalf("decision %+v, want HBONE through a waypoint with authority %s", view(r), dst)
		}
		if want := r.DstWorkload.Addresses[0]; r.NextHop != netip.AddrPortFrom(want, HBONEPort) {
			t.Fatalf("next hop %s is not waypoint %s's HBONE port", r.NextHop, r.DstWorkload.Name)
		}
		if r.UpstreamIdentity != r.DstWorkload.Identity() {
			t.Fatalf("upstream identity %s, waypoint %s", r.UpstreamIdentity, r.DstWorkload.Identity())
		}
		counts[r.DstWorkload.Name]++
	}
	if counts["off-1"] != 0 {
		t.Errorf("weight-0 waypoint got %d of %d connections", counts["off-1"], n)
	}
	for name, p := range map[string]float64{"stable-1": 0.75, "canary-1": 0.25} {
		mean, sd := n*p, math.Sqrt(n*p*(1-p))
		if got := float64(counts[name]); math.Abs(got-mean) > 5*sd {
			t.Errorf("%s got %v of %d connections, want %v ± %.0f", name, got, n, mean, 5*sd)
		}
	}
	t.Logf("split over %d connections: %v", n, counts)
}

// TestRouteWeightedWaypoints covers the edges with a fixed random source.
func TestRouteWeightedWaypoints(t *testing.T) {
	snap := canaryMesh(t)
	client := snap.WorkloadByUID(pt.UID("apps", "client"))
	canary := snap.WorkloadByUID(pt.UID("apps", "canary-1"))
	off := snap.WorkloadByUID(pt.UID("apps", "off-1"))
	// fixed(v) draws v (clamped into range) every time.
	fixed := func(v int) func(int) int { return func(n int) int { return min(v, n-1) } }
	tests := []struct {
		name    string
		src     *state.Workload
		dst     string
		rnd     func(int) int
		wantDst string
		wantWP  bool
		wantErr error
	}{
		{name: "last draw of the first weight", src: client, dst: "10.96.0.1:80", rnd: fixed(2), wantDst: "stable-1", wantWP: true},
		{name: "first draw of the second weight", src: client, dst: "10.96.0.1:80", rnd: fixed(3), wantDst: "canary-1", wantWP: true},
		{name: "all weights zero: the primary", src: client, dst: "10.96.0.2:80", rnd: fixed(0), wantDst: "stable-1", wantWP: true},
		{name: "no weighted list: the primary", src: client, dst: "10.96.0.4:80", rnd: fixed(0), wantDst: "stable-1", wantWP: true},
		{name: "drawn waypoint unresolvable: fail closed", src: client, dst: "10.96.0.3:80", rnd: fixed(1), wantErr: ErrUnknownWaypoint},
		{name: "resolvable draw of the same set", src: client, dst: "10.96.0.3:80", rnd: fixed(0), wantDst: "stable-1", wantWP: true},
		// A waypoint of the set forwarding on goes to the endpoint, never
		// to a sibling waypoint, whatever the draw.
		{name: "canary waypoint forwards to the endpoint", src: canary, dst: "10.96.0.1:80", rnd: fixed(0), wantDst: "backend"},
		{name: "weight-0 waypoint forwards to the endpoint", src: off, dst: "10.96.0.1:80", rnd: fixed(0), wantDst: "backend"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := OutboundWith(snap, tt.src, netip.MustParseAddrPort(tt.dst), tt.rnd)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.DstWorkload == nil || r.DstWorkload.Name != tt.wantDst || r.Waypoint != tt.wantWP {
				t.Fatalf("decision %+v, want dst %s waypoint=%v", view(r), tt.wantDst, tt.wantWP)
			}
		})
	}

	d := netip.MustParseAddrPort("10.96.0.1:80")
	if n := testing.AllocsPerRun(100, func() { _, _ = Outbound(snap, client, d) }); n != 0 {
		t.Errorf("weighted route allocates %.1f times; want 0", n)
	}
}
