package route

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// networkMesh is a two-network mesh from the local network's ("") point of
// view, as istiod sends it in multi-network ambient: remote workloads
// carry their network and, when reachable, a network gateway; those
// behind a gateway have no address.
func networkMesh(t testing.TB) *state.Store {
	s := state.NewStore()
	k := pt.ServiceKey
	east := pt.Network("east")
	gwByIP := pt.NetworkGateway(pt.GatewayIP("east", "172.16.0.1", 15008))
	gwByHost := pt.NetworkGateway(pt.GatewayHost("istio-system", "eastwest", 15009))
	pt.Apply(t, s,
		pt.Pod("apps", "client", "10.0.0.1"),
		pt.Pod("apps", "local-a", "10.0.1.1", pt.InService(k("apps", "both"), 80, 8080)),
		pt.Pod("apps", "remote-a", "", east, gwByIP, pt.InService(k("apps", "remote"), 80, 8080), pt.InService(k("apps", "both"), 80, 8080)),
		pt.Pod("apps", "remote-h", "", east, gwByHost, pt.InService(k("apps", "remote-h"), 80, 8080)),
		pt.Pod("apps", "remote-nogw", "10.1.0.5", east, pt.InService(k("apps", "nogw"), 80, 8080)),
		pt.Pod("apps", "remote-badgw", "", east, pt.NetworkGateway(pt.GatewayIP("east", "172.16.9.9", 15008)),
			pt.InService(k("apps", "badgw"), 80, 8080)),
		// The gateways: one known by IP, one by its service (15009 → 15008).
		pt.Pod("istio-system", "ew-a", "172.16.0.1", east, pt.ServiceAccount("eastwest")),
		pt.Pod("istio-system", "ew-b", "172.16.0.2", east, pt.ServiceAccount("eastwest"),
			pt.InService(k("istio-system", "eastwest"), 15009, 15008)),
		pt.Service("istio-system", "eastwest", "172.16.0.100", []uint32{15009, 15008},
			pt.SANs("spiffe://cluster.local/ns/istio-system/sa/eastwest-svc")),
		// A service whose waypoint runs on the remote network.
		pt.Pod("apps", "rwp", "", east, gwByIP, pt.ServiceAccount("waypoint"), pt.InService(k("apps", "rwaypoint"), 15008, 15008)),
		pt.Service("apps", "rwaypoint", "10.96.1.6", []uint32{15008, 15008}, pt.SANs("spiffe://cluster.local/ns/apps/sa/waypoint-svc")),
		pt.Service("apps", "behind-rwp", "10.96.1.5", []uint32{80, 8080}, pt.ServiceWaypoint(pt.WaypointHost("apps", "rwaypoint"))),
		// A service whose waypoint, known by IP, is on the remote network
		// without a gateway.
		pt.Service("apps", "behind-nogw-wp", "10.96.1.8", []uint32{80, 8080},
			pt.ServiceWaypoint(pt.GatewayIP("east", "10.1.0.9", 15008))),
		// A local pod whose (workload) waypoint is on the remote network.
		pt.Pod("apps", "east-wp", "10.1.0.9", east, pt.ServiceAccount("waypoint")),
		pt.Pod("apps", "wl-remote-wp", "10.0.1.7", pt.WorkloadWaypoint(pt.GatewayIP("east", "10.1.0.9", 15008))),

		pt.Service("apps", "remote", "10.96.1.1", []uint32{80, 8080}, pt.SANs("spiffe://cluster.local/ns/apps/sa/remote-svc")),
		pt.Service("apps", "remote-h", "10.96.1.3", []uint32{80, 8080}),
		pt.Service("apps", "nogw", "10.96.1.2", []uint32{80, 8080}),
		pt.Service("apps", "badgw", "10.96.1.4", []uint32{80, 8080}),
		pt.Service("apps", "both", "10.96.1.7", []uint32{80, 8080}),
	)
	return s
}

// doubleView is a DoubleHBONE Decision reduced to names, for tables.
type doubleView struct {
	Kind      Kind
	NextHop   string
	Authority string // host:port
	Outer     string // UpstreamIdentities
	Final     string // FinalIdentities
	Gateway   string
	Service   string
	Dst       string
	Waypoint  bool
}

func dview(r Decision) doubleView {
	v := doubleView{Kind: r.Kind, NextHop: r.NextHop.String(), Waypoint: r.Waypoint,
		Outer: fmt.Sprint(r.UpstreamIdentities()), Final: fmt.Sprint(r.FinalIdentities())}
	if r.AuthorityHost != "" {
		v.Authority = fmt.Sprintf("%s:%d", r.AuthorityHost, r.Authority.Port())
	} else if r.Authority.IsValid() {
		v.Authority = r.Authority.String()
	}
	if r.Gateway != nil {
		v.Gateway = r.Gateway.Name
	}
	if r.Service != nil {
		v.Service = r.Service.Name
	}
	if r.DstWorkload != nil {
		v.Dst = r.DstWorkload.Name
	}
	return v
}

func TestRouteAcrossNetworks(t *testing.T) {
	snap := networkMesh(t).Load()
	client := snap.WorkloadByUID(pt.UID("apps", "client"))
	const (
		sa    = "spiffe://cluster.local/ns/"
		idEW  = sa + "istio-system/sa/eastwest"
		idEWS = sa + "istio-system/sa/eastwest-svc"
	)
	tests := []struct {
		name    string
		dst     string
		want    doubleView
		wantErr error
	}{
		{name: "endpoint behind a gateway known by IP", dst: "10.96.1.1:80",
			want: doubleView{Kind: DoubleHBONE, NextHop: "172.16.0.1:15008",
				Authority: "remote.apps.svc.cluster.local:80",
				Outer:     "[" + idEW + "]",
				Final:     "[" + sa + "apps/sa/sa-remote-a " + sa + "apps/sa/remote-svc]",
				Gateway:   "ew-a", Service: "remote", Dst: "remote-a"}},
		{name: "endpoint behind a gateway known by service: its target port and SANs", dst: "10.96.1.3:80",
			want: doubleView{Kind: DoubleHBONE, NextHop: "172.16.0.2:15008",
				Authority: "remote-h.apps.svc.cluster.local:80",
				Outer:     "[" + idEW + " " + idEWS + "]",
				Final:     "[" + sa + "apps/sa/sa-remote-h]",
				Gateway:   "ew-b", Service: "remote-h", Dst: "remote-h"}},
		{name: "remote waypoint: authority stays the service, final is the waypoint", dst: "10.96.1.5:80",
			want: doubleView{Kind: DoubleHBONE, NextHop: "172.16.0.1:15008",
				Authority: "behind-rwp.apps.svc.cluster.local:80",
				Outer:     "[" + idEW + "]",
				Final:     "[" + sa + "apps/sa/waypoint " + sa + "apps/sa/waypoint-svc]",
				Gateway:   "ew-a", Service: "behind-rwp", Dst: "rwp", Waypoint: true}},
		{name: "remote endpoint without a gateway is never dialled", dst: "10.96.1.2:80", wantErr: ErrNoHealthyUpstream},
		{name: "unknown network gateway", dst: "10.96.1.4:80", wantErr: ErrOtherNetwork},
		{name: "remote waypoint without a gateway", dst: "10.96.1.8:80", wantErr: ErrOtherNetwork},
		{name: "workload-addressed, waypoint on another network", dst: "10.0.1.7:8080", wantErr: ErrOtherNetwork},
		{name: "remote pod IP is not on this network", dst: "10.1.0.5:8080",
			want: doubleView{Kind: Passthrough, NextHop: "10.1.0.5:8080", Outer: "[]", Final: "[]"}},
	}
	first := func(int) int { return 0 }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := OutboundWith(snap, client, netip.MustParseAddrPort(tt.dst), first)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := dview(r); got != tt.want {
				t.Errorf("route =\n  %+v\nwant\n  %+v", got, tt.want)
			}
		})
	}
}

// TestRouteAcrossNetworksSameNetworkUnchanged: a service with a local and a
// remote endpoint routes to the local one by plain HBONE, as before, and to
// the remote one by double HBONE, draw by draw.
func TestRouteAcrossNetworksSameNetworkUnchanged(t *testing.T) {
	snap := networkMesh(t).Load()
	client := snap.WorkloadByUID(pt.UID("apps", "client"))
	kinds := map[string]Kind{}
	for r := range 2 {
		d, err := OutboundWith(snap, client, netip.MustParseAddrPort("10.96.1.7:80"), func(int) int { return r })
		if err != nil {
			t.Fatal(err)
		}
		kinds[d.DstWorkload.Name] = d.Kind
		if d.Kind == HBONE && (d.NextHop.String() != "10.0.1.1:15008" || d.Authority.String() != "10.0.1.1:8080" || d.AuthorityHost != "") {
			t.Errorf("local endpoint: %+v, want plain HBONE to 10.0.1.1", dview(d))
		}
	}
	if kinds["local-a"] != HBONE || kinds["remote-a"] != DoubleHBONE {
		t.Errorf("kinds by endpoint = %v, want local-a hbone, remote-a double-hbone", kinds)
	}
}

func TestRouteAcrossNetworksNoAllocs(t *testing.T) {
	snap := networkMesh(t).Load()
	client := snap.WorkloadByUID(pt.UID("apps", "client"))
	dst := netip.MustParseAddrPort("10.96.1.3:80")
	first := func(int) int { return 0 }
	allocs := testing.AllocsPerRun(200, func() {
		if r, err := OutboundWith(snap, client, dst, first); err != nil || r.Kind != DoubleHBONE {
			t.Fatalf("route: %v, %v", r.Kind, err)
		}
	})
	if allocs != 0 {
		t.Errorf("Outbound across networks allocates %v per call, want 0", allocs)
	}
}
