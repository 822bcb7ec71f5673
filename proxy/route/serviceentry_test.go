package route

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestRouteServiceEntryCIDR: the outbound decision for destinations inside
// CIDR VIPs, a PASSTHROUGH (resolution NONE) service and a VIP several
// namespaces share (the canonical one wins for a client of none of them).
func TestRouteServiceEntryCIDR(t *testing.T) {
	cidr := func(p string) pt.ServiceOpt {
		return func(s *workloadapi.Service) {
			pf := netip.MustParsePrefix(p)
			s.Addresses = append(s.Addresses, &workloadapi.NetworkAddress{Address: pf.Addr().AsSlice(), Length: new(uint32(pf.Bits()))})
		}
	}
	passthrough := func(s *workloadapi.Service) {
		s.LoadBalancing = &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_PASSTHROUGH, HealthPolicy: workloadapi.LoadBalancing_ALLOW_ALL}
	}
	canonical := func(s *workloadapi.Service) { s.Canonical = true }
	s := state.NewStore()
	pt.Apply(t, s,
		pt.Pod("apps", "client", "10.0.0.1"),
		pt.Pod("egress", "db-0", "10.0.5.1", pt.InService(pt.ServiceKey("egress", "db-range"), 5432, 5432)),
		pt.Pod("egress", "waypoint", "10.0.3.1", pt.ServiceAccount("waypoint")),
		// STATIC over a range: load-balanced to its endpoint.
		pt.Service("egress", "db-range", "", []uint32{5432, 5432}, cidr("10.20.0.0/16")),
		// NONE over a wider range: original destination, named.
		pt.Service("egress", "corp", "", []uint32{443, 443}, cidr("10.0.0.0/8"), passthrough),
		// NONE with a waypoint: the waypoint still applies.
		pt.Service("egress", "audited", "", []uint32{443, 443}, cidr("10.30.0.0/16"), passthrough,
			pt.ServiceWaypoint(pt.WaypointIP("10.0.3.1"))),
		// One exact VIP three namespaces define.
		pt.Service("team-a", "api", "192.0.2.50", []uint32{443, 443}, passthrough),
		pt.Service("team-b", "api", "192.0.2.50", []uint32{443, 443}, passthrough, canonical),
		pt.Service("apps", "api", "192.0.2.50", []uint32{443, 443}, passthrough),
	)
	snap := s.Load()
	client := snap.WorkloadByUID(pt.UID("apps", "client"))
	other := snap.WorkloadByUID(pt.UID("egress", "db-0"))
	for _, tc := range []struct {
		src  *state.Workload
		dst  string
		want routeView
	}{
		{client, "10.20.9.9:5432", routeView{Kind: HBONE, NextHop: "10.0.5.1:15008", Authority: "10.0.5.1:5432",
			IDs: "[spiffe://cluster.local/ns/egress/sa/sa-db-0]", Service: "db-range", Dst: "db-0"}},
		{client, "10.99.1.1:443", routeView{Kind: Passthrough, NextHop: "10.99.1.1:443", Service: "corp"}},
		// A workload IP inside a CIDR VIP: the workload owns its address, a range never takes it.
		{client, "10.0.5.1:443", routeView{Kind: HBONE, NextHop: "10.0.5.1:15008", Authority: "10.0.5.1:443",
			IDs: "[spiffe://cluster.local/ns/egress/sa/sa-db-0]", Dst: "db-0"}},
		{client, "10.30.1.1:443", routeView{Kind: HBONE, NextHop: "10.0.3.1:15008", Authority: "10.30.1.1:443",
			IDs: "[spiffe://cluster.local/ns/egress/sa/waypoint]", Dst: "waypoint", Service: "audited", Waypoint: true}},
		{client, "11.0.0.1:443", routeView{Kind: Passthrough, NextHop: "11.0.0.1:443"}},
		{client, "192.0.2.50:443", routeView{Kind: Passthrough, NextHop: "192.0.2.50:443", Service: "api"}},
		{other, "192.0.2.50:443", routeView{Kind: Passthrough, NextHop: "192.0.2.50:443", Service: "api"}},
		{nil, "192.0.2.50:443", routeView{Kind: Passthrough, NextHop: "192.0.2.50:443", Service: "api"}},
	} {
		d, err := Outbound(snap, tc.src, netip.MustParseAddrPort(tc.dst))
		if err != nil {
			t.Errorf("%s: %v", tc.dst, err)
			continue
		}
		if got := view(d); got != tc.want {
			t.Errorf("%s: got %+v\nwant %+v", tc.dst, got, tc.want)
		}
	}
	// The shared VIP: the client's own namespace, else the canonical one.
	for src, wantNs := range map[*state.Workload]string{client: "apps", other: "team-b", nil: "team-b"} {
		d, _ := Outbound(snap, src, netip.MustParseAddrPort("192.0.2.50:443"))
		if d.Service == nil || d.Service.Namespace != wantNs {
			t.Errorf("shared VIP from %v: service %v, want namespace %s", src, d.Service, wantNs)
		}
	}
}
