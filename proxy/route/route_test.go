package route

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// routeMesh is the mesh the routing table runs against, built from WDS
// protobufs as istiod sends them.
func routeMesh(t testing.TB) *state.Store {
	s := state.NewStore()
	k := pt.ServiceKey
	pt.Apply(t, s,
		pt.Pod("apps", "client", "10.0.0.1"),
		pt.Pod("apps", "server-a", "10.0.1.1", pt.InService(k("apps", "server"), 80, 8080), pt.InService(k("apps", "named"), 9090, 9091)),
		pt.Pod("apps", "behind", "10.0.1.2", pt.InService(k("apps", "wp-svc"), 80, 8080)),
		pt.Pod("apps", "wl-wp", "10.0.1.3", pt.WorkloadWaypoint(pt.WaypointIP("10.0.3.1"))),
		pt.Pod("apps", "server-b", "10.0.1.4", pt.InService(k("apps", "sans"), 80, 8080)),
		pt.Pod("apps", "sick", "10.0.1.9", pt.Unhealthy(), pt.InService(k("apps", "sick"), 80, 8080)),
		pt.Pod("apps", "legacy", "10.0.2.1", pt.Plaintext(), pt.InService(k("apps", "legacy"), 80, 8080)),
		pt.Pod("apps", "waypoint", "10.0.3.1", pt.ServiceAccount("waypoint"), pt.InService(k("apps", "waypoint"), 15008, 15008)),
		pt.Service("apps", "server", "10.96.0.1", []uint32{80, 8080}),
		pt.Service("apps", "legacy", "10.96.0.2", []uint32{80, 8080}),
		pt.Service("apps", "empty", "10.96.0.3", []uint32{80, 8080}),
		pt.Service("apps", "sick", "10.96.0.4", []uint32{80, 8080}),
		pt.Service("apps", "wp-svc", "10.96.0.5", []uint32{80, 8080}, pt.ServiceWaypoint(pt.WaypointHost("apps", "waypoint"))),
		pt.Service("apps", "sans", "10.96.0.6", []uint32{80, 8080}, pt.SANs("spiffe://cluster.local/ns/apps/sa/extra")),
		pt.Service("apps", "badwp", "10.96.0.7", []uint32{80, 8080}, pt.ServiceWaypoint(pt.WaypointHost("apps", "nope"))),
		pt.Service("apps", "named", "10.96.0.8", []uint32{9090, 0}),
		pt.Service("apps", "waypoint", "10.96.0.10", []uint32{15008, 15008},
			pt.SANs("spiffe://cluster.local/ns/apps/sa/waypoint-svc")),
	)
	return s
}

// routeView is a Decision with pointers reduced to names, for tables.
type routeView struct {
	Kind      Kind
	NextHop   string
	Authority string
	IDs       string
	Service   string
	Dst       string
	Waypoint  bool
}

func view(r Decision) routeView {
	v := routeView{Kind: r.Kind, NextHop: r.NextHop.String(), Waypoint: r.Waypoint}
	if r.Authority.IsValid() {
		v.Authority = r.Authority.String()
	}
	if ids := r.UpstreamIdentities(); ids != nil {
		v.IDs = fmt.Sprint(ids)
	}
	if r.Service != nil {
		v.Service = r.Service.Name
	}
	if r.DstWorkload != nil {
		v.Dst = r.DstWorkload.Name
	}
	return v
}

func TestRoute(t *testing.T) {
	s := routeMesh(t)
	snap := s.Load()
	client := snap.WorkloadByUID(pt.UID("apps", "client"))
	waypoint := snap.WorkloadByUID(pt.UID("apps", "waypoint"))
	const (
		idA  = "spiffe://cluster.local/ns/apps/sa/sa-server-a"
		idWP = "spiffe://cluster.local/ns/apps/sa/waypoint"
	)
	tests := []struct {
		name    string
		src     *state.Workload
		dst     string
		want    routeView
		wantErr error
	}{
		{name: "loopback hbone port", src: client, dst: "127.0.0.1:15008", wantErr: ErrIllegalPort},
		{name: "loopback outbound port", src: client, dst: "127.0.0.1:15001", wantErr: ErrIllegalPort},
		{name: "loopback v6 plaintext port", src: client, dst: "[::1]:15006", wantErr: ErrIllegalPort},
		{name: "loopback other port passes through", src: client, dst: "127.0.0.1:8080",
			want: routeView{Kind: Passthrough, NextHop: "127.0.0.1:8080"}},
		{name: "service VIP to HBONE endpoint", src: client, dst: "10.96.0.1:80",
			want: routeView{Kind: HBONE, NextHop: "10.0.1.1:15008", Authority: "10.0.1.1:8080",
				IDs: "[" + idA + "]", Service: "server", Dst: "server-a"}},
		{name: "v4-mapped service VIP", src: client, dst: "[::ffff:10.96.0.1]:80",
			want: routeView{Kind: HBONE, NextHop: "10.0.1.1:15008", Authority: "10.0.1.1:8080",
				IDs: "[" + idA + "]", Service: "server", Dst: "server-a"}},
		{name: "unknown source still routes", src: nil, dst: "10.96.0.1:80",
			want: routeView{Kind: HBONE, NextHop: "10.0.1.1:15008", Authority: "10.0.1.1:8080",
				IDs: "[" + idA + "]", Service: "server", Dst: "server-a"}},
		{name: "named port from the endpoint", src: client, dst: "10.96.0.8:9090",
			want: routeView{Kind: HBONE, NextHop: "10.0.1.1:15008", Authority: "10.0.1.1:9091",
				IDs: "[" + idA + "]", Service: "named", Dst: "server-a"}},
		{name: "service SANs follow the workload identity", src: client, dst: "10.96.0.6:80",
			want: routeView{Kind: HBONE, NextHop: "10.0.1.4:15008", Authority: "10.0.1.4:8080",
				IDs:     "[spiffe://cluster.local/ns/apps/sa/sa-server-b spiffe://cluster.local/ns/apps/sa/extra]",
				Service: "sans", Dst: "server-b"}},
		{name: "service VIP to plaintext endpoint", src: client, dst: "10.96.0.2:80",
			want: routeView{Kind: Direct, NextHop: "10.0.2.1:8080", Service: "legacy", Dst: "legacy"}},
		{name: "undeclared service port", src: client, dst: "10.96.0.1:81", wantErr: ErrNoHealthyUpstream},
		{name: "service without endpoints", src: client, dst: "10.96.0.3:80", wantErr: ErrNoHealthyUpstream},
		{name: "service with only unhealthy endpoints", src: client, dst: "10.96.0.4:80", wantErr: ErrNoHealthyUpstream},
		{name: "service waypoint keeps the original authority", src: client, dst: "10.96.0.5:80",
			want: routeView{Kind: HBONE, NextHop: "10.0.3.1:15008", Authority: "10.96.0.5:80",
				IDs:     "[" + idWP + " spiffe://cluster.local/ns/apps/sa/waypoint-svc]",
				Service: "wp-svc", Dst: "waypoint", Waypoint: true}},
		{name: "the waypoint itself goes to the endpoint", src: waypoint, dst: "10.96.0.5:80",
			want: routeView{Kind: HBONE, NextHop: "10.0.1.2:15008", Authority: "10.0.1.2:8080",
				IDs: "[spiffe://cluster.local/ns/apps/sa/sa-behind]", Service: "wp-svc", Dst: "behind"}},
		{name: "unresolvable waypoint", src: client, dst: "10.96.0.7:80", wantErr: ErrUnknownWaypoint},
		{name: "pod IP to HBONE workload", src: client, dst: "10.0.1.1:8080",
			want: routeView{Kind: HBONE, NextHop: "10.0.1.1:15008", Authority: "10.0.1.1:8080",
				IDs: "[" + idA + "]", Dst: "server-a"}},
		{name: "pod IP to workload with waypoint", src: client, dst: "10.0.1.3:8080",
			want: routeView{Kind: HBONE, NextHop: "10.0.3.1:15008", Authority: "10.0.1.3:8080",
				IDs: "[" + idWP + "]", Dst: "waypoint", Waypoint: true}},
		{name: "pod IP from its own waypoint", src: waypoint, dst: "10.0.1.3:8080",
			want: routeView{Kind: HBONE, NextHop: "10.0.1.3:15008", Authority: "10.0.1.3:8080",
				IDs: "[spiffe://cluster.local/ns/apps/sa/sa-wl-wp]", Dst: "wl-wp"}},
		{name: "pod IP to plaintext workload", src: client, dst: "10.0.2.1:9000",
			want: routeView{Kind: Direct, NextHop: "10.0.2.1:9000", Dst: "legacy"}},
		{name: "unknown destination passes through", src: client, dst: "192.0.2.1:443",
			want: routeView{Kind: Passthrough, NextHop: "192.0.2.1:443"}},
	}
	first := func(int) int { return 0 }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := OutboundWith(snap, tt.src, netip.MustParseAddrPort(tt.dst), first)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := view(r); got != tt.want {
				t.Errorf("route\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// TestRouteLoadBalances checks that OutboundWith hands the random source to
// endpoint selection: each endpoint is reachable.
func TestRouteLoadBalances(t *testing.T) {
	s := routeMesh(t)
	pt.Apply(t, s, pt.Pod("apps", "server-c", "10.0.1.5", pt.InService(pt.ServiceKey("apps", "server"), 80, 8080)))
	snap := s.Load()
	seen := map[string]bool{}
	for i := 0; i < 2; i++ {
		r, err := OutboundWith(snap, nil, netip.MustParseAddrPort("10.96.0.1:80"), func(int) int { return i })
		if err != nil {
			t.Fatal(err)
		}
		seen[r.DstWorkload.Name] = true
	}
	if !seen["server-a"] || !seen["server-c"] {
		t.Fatalf("endpoints picked: %v, want both", seen)
	}
}

func TestRouteNoAllocs(t *testing.T) {
	s := routeMesh(t)
	snap := s.Load()
	client := snap.WorkloadByUID(pt.UID("apps", "client"))
	for _, dst := range []string{"10.96.0.1:80", "10.96.0.5:80", "10.0.1.1:8080", "10.0.1.3:8080", "10.96.0.2:80", "192.0.2.1:443"} {
		d := netip.MustParseAddrPort(dst)
		if _, err := Outbound(snap, client, d); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = Outbound(snap, client, d) }); n != 0 {
			t.Errorf("Route to %s allocates %.1f times; want 0", dst, n)
		}
	}
}

func BenchmarkRoute(b *testing.B) {
	s := routeMesh(b)
	snap := s.Load()
	client := snap.WorkloadByUID(pt.UID("apps", "client"))
	d := netip.MustParseAddrPort("10.96.0.1:80")
	b.ReportAllocs()
	for b.Loop() {
		_, _ = Outbound(snap, client, d)
	}
}

// TestFailClosedEgressServiceEntry: a ServiceEntry with resolution DNS
// (an auto-allocated VIP, endpoint known by hostname) routes to the
// hostname for the listener to resolve; one with resolution NONE
// (PASSTHROUGH) goes to the original destination with the service named.
// Both failed before (unsupported; no healthy upstream). Issue 12 item 7.
func TestFailClosedEgressServiceEntry(t *testing.T) {
	s := state.NewStore()
	hostname := func(h string) pt.WorkloadOpt {
		return func(w *workloadapi.Workload) { w.Hostname = h }
	}
	passthrough := func(svc *workloadapi.Service) {
		svc.LoadBalancing = &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_PASSTHROUGH,
			HealthPolicy: workloadapi.LoadBalancing_ALLOW_ALL}
	}
	pt.Apply(t, s,
		pt.Pod("apps", "client", "10.0.0.1"),
		pt.Pod("egress", "ext-dns", "", hostname("ext.example.com"), pt.Plaintext(),
			pt.InService("egress/ext.example.com", 443, 8443)),
		pt.Pod("egress", "ext-hbone", "", hostname("mesh.example.com"), pt.InService("egress/mesh.example.com", 80, 8080)),
		&workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: "ext-dns", Namespace: "egress", Hostname: "ext.example.com",
			Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr("240.240.0.1").AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 443, TargetPort: 8443}},
		}}},
		&workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: "ext-hbone", Namespace: "egress", Hostname: "mesh.example.com",
			Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr("240.240.0.2").AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
		}}},
		pt.Service("egress", "ext-none", "192.0.2.50", []uint32{443, 443}, passthrough),
	)
	snap := s.Load()
	client := snap.WorkloadByUID(pt.UID("apps", "client"))

	r, err := Outbound(snap, client, netip.MustParseAddrPort("240.240.0.1:443"))
	if err != nil {
		t.Fatalf("resolution DNS: %v", err)
	}
	if r.Kind != Direct || r.Hostname != "ext.example.com" || r.NextHop.Port() != 8443 || r.Service == nil ||
		r.DstWorkload == nil || r.DstWorkload.Name != "ext-dns" {
		t.Fatalf("resolution DNS: %+v", view(r))
	}
	ip := netip.MustParseAddr("198.51.100.7")
	if got := r.Resolved(ip); got.NextHop != netip.AddrPortFrom(ip, 8443) || got.Hostname != "" {
		t.Fatalf("resolved: %+v", view(got))
	}

	r, err = Outbound(snap, client, netip.MustParseAddrPort("240.240.0.2:80"))
	if err != nil {
		t.Fatalf("resolution DNS, HBONE endpoint: %v", err)
	}
	if got := r.Resolved(ip); got.Kind != HBONE || got.NextHop != netip.AddrPortFrom(ip, HBONEPort) ||
		got.Authority != netip.AddrPortFrom(ip, 8080) || got.UpstreamIdentity.IsZero() {
		t.Fatalf("resolution DNS, HBONE endpoint resolved: %+v", view(got))
	}

	r, err = Outbound(snap, client, netip.MustParseAddrPort("192.0.2.50:443"))
	if err != nil {
		t.Fatalf("resolution NONE: %v", err)
	}
	if r.Kind != Passthrough || r.NextHop != netip.MustParseAddrPort("192.0.2.50:443") || r.Service == nil ||
		r.Service.Hostname != pt.Hostname("egress", "ext-none") {
		t.Fatalf("resolution NONE: %+v", view(r))
	}
	for _, dst := range []string{"240.240.0.1:443", "192.0.2.50:443"} {
		d := netip.MustParseAddrPort(dst)
		if n := testing.AllocsPerRun(100, func() { _, _ = Outbound(snap, client, d) }); n != 0 {
			t.Errorf("Route to %s allocates %.1f times; want 0", dst, n)
		}
	}
}
