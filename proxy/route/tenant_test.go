package route

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestRouteTenantRangeCapturesNoOwnedAddress is issue 24's attack on the
// node proxy alone (as if the control plane had let it through): namespace
// evil's ServiceEntry 0.0.0.0/0 with resolution NONE bound to evil's
// waypoint. Every address someone owns (a victim pod, a host-network
// workload's node IP, a victim Service's ClusterIP, even one exported only
// to the victim's namespace) keeps its owner's route for every client;
// only an address nobody in the mesh holds falls to the range.
func TestRouteTenantRangeCapturesNoOwnedAddress(t *testing.T) {
	whole := func(s *workloadapi.Service) {
		s.Addresses = append(s.Addresses, &workloadapi.NetworkAddress{Address: netip.IPv4Unspecified().AsSlice(), Length: new(uint32(0))})
		s.LoadBalancing = &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_PASSTHROUGH, HealthPolicy: workloadapi.LoadBalancing_ALLOW_ALL}
	}
	private := func(s *workloadapi.Service) { s.Visibility = workloadapi.Service_NAMESPACE }
	hostNet := func(w *workloadapi.Workload) { w.NetworkMode = workloadapi.NetworkMode_HOST_NETWORK }
	s := state.NewStore()
	pt.Apply(t, s,
		pt.Pod("victim", "client", "10.0.0.1"),
		pt.Pod("victim", "web-0", "10.0.0.2", pt.InService(pt.ServiceKey("victim", "web"), 80, 8080)),
		pt.Pod("victim", "db-0", "10.0.0.3", pt.InService(pt.ServiceKey("victim", "db"), 5432, 5432)),
		pt.Pod("kube-system", "kube-proxy", "172.18.0.2", hostNet),
		pt.Pod("evil", "client", "10.0.1.1"),
		pt.Pod("evil", "wp", "10.0.1.2", pt.ServiceAccount("wp")),
		pt.Service("victim", "web", "10.96.0.10", []uint32{80, 8080}),
		pt.Service("victim", "db", "10.96.0.11", []uint32{5432, 5432}, private),
		pt.Service("evil", "all", "", []uint32{80, 80}, whole, pt.ServiceWaypoint(pt.WaypointIP("10.0.1.2"))),
	)
	snap := s.Load()
	victim := snap.WorkloadByUID(pt.UID("victim", "client"))
	evil := snap.WorkloadByUID(pt.UID("evil", "client"))
	for _, src := range []*state.Workload{victim, evil, nil} {
		for _, tc := range []struct {
			dst  string
			want routeView
		}{
			// Pod to pod by IP: straight to the pod.
			{"10.0.0.2:8080", routeView{Kind: HBONE, NextHop: "10.0.0.2:15008", Authority: "10.0.0.2:8080",
				IDs: "[spiffe://cluster.local/ns/victim/sa/sa-web-0]", Dst: "web-0"}},
			// The victim's Service: its endpoint.
			{"10.96.0.10:80", routeView{Kind: HBONE, NextHop: "10.0.0.2:15008", Authority: "10.0.0.2:8080",
				IDs: "[spiffe://cluster.local/ns/victim/sa/sa-web-0]", Service: "web", Dst: "web-0"}},
			// A node address (a host-network workload's): not the range's.
			{"172.18.0.2:10250", routeView{Kind: Passthrough, NextHop: "172.18.0.2:10250"}},
		} {
			d, err := Outbound(snap, src, netip.MustParseAddrPort(tc.dst))
			if err != nil {
				t.Errorf("from %v to %s: %v", src, tc.dst, err)
				continue
			}
			if got := view(d); got != tc.want {
				t.Errorf("from %v to %s: got %+v\nwant %+v", src, tc.dst, got, tc.want)
			}
		}
	}
	// A ClusterIP the client may not see is still not the range's: the
	// connection leaves as it was dialled, never to evil's waypoint.
	d, err := Outbound(snap, evil, netip.MustParseAddrPort("10.96.0.11:5432"))
	if err != nil || d.Waypoint || d.Service != nil || d.Kind != Passthrough {
		t.Errorf("evil to victim's namespace-private ClusterIP: %+v (%v), want plain passthrough", view(d), err)
	}
	// What nobody owns is the range's (and so its waypoint's).
	d, err = Outbound(snap, evil, netip.MustParseAddrPort("93.184.216.34:80"))
	if err != nil || !d.Waypoint || d.Service == nil || d.Service.Namespace != "evil" {
		t.Errorf("evil to an external address: %+v (%v), want evil's waypoint", view(d), err)
	}
}
