package eastwest

import (
	"errors"
	"net/netip"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

var (
	vip      = netip.MustParseAddr("10.96.0.10")
	wpVIP    = netip.MustParseAddr("10.96.0.20")
	podWest  = netip.MustParseAddr("10.1.0.5")
	podWest2 = netip.MustParseAddr("10.1.0.6")
	podEast  = netip.MustParseAddr("10.2.0.5")
	wpPod    = netip.MustParseAddr("10.1.0.9")
)

const echoKey = echoNS + "/" + echoSvc

// TestRoute walks the gateway's decision: only global services, only
// declared ports, only HBONE endpoints on the gateway's own network, and
// the waypoint instead of the endpoints when the service has one. Every
// case runs with every draw rnd can make, so "never" means never.
func TestRoute(t *testing.T) {
	wpSvc := service("infra", "wp", "wp.infra.svc.cluster.local", wpVIP)
	wpPodWest := pod("infra", "wp-1", west, wpPod, "infra/wp.infra.svc.cluster.local", tcpOnly)
	for _, tc := range []struct {
		name   string
		res    []*workloadapi.Address
		host   string
		port   uint16
		want   netip.AddrPort
		wantWp bool
		err    error
	}{
		{name: "global service, endpoint on our network",
			res:  []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global), pod(echoNS, "e1", west, podWest, echoKey)},
			want: netip.AddrPortFrom(podWest, 15008)},
		{name: "unknown hostname",
			res:  []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global), pod(echoNS, "e1", west, podWest, echoKey)},
			host: "other.demo.svc.cluster.local", err: ErrUnknownHost},
		{name: "service not of global scope",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip), pod(echoNS, "e1", west, podWest, echoKey)},
			err: ErrNotGlobal},
		{name: "port the service does not declare",
			res:  []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global), pod(echoNS, "e1", west, podWest, echoKey)},
			port: 81, err: ErrUnknownPort},
		{name: "endpoint on another network is never chosen, even with more capacity",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global), pod(echoNS, "e1", west, podWest, echoKey),
				pod(echoNS, "e2", east, podEast, echoKey, func(w *workloadapi.Workload) { w.Capacity = wrapperspb.UInt32(50) })},
			want: netip.AddrPortFrom(podWest, 15008)},
		{name: "only endpoints on another network",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global), pod(echoNS, "e2", east, podEast, echoKey)},
			err: ErrNoEndpoint},
		{name: "endpoint without HBONE is never chosen",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global), pod(echoNS, "e1", west, podWest, echoKey, tcpOnly),
				pod(echoNS, "e3", west, podWest2, echoKey)},
			want: netip.AddrPortFrom(podWest2, 15008)},
		{name: "only an endpoint without HBONE",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global), pod(echoNS, "e1", west, podWest, echoKey, tcpOnly)},
			err: ErrNoEndpoint},
		{name: "unhealthy endpoint is never chosen",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global), pod(echoNS, "e1", west, podWest, echoKey, unhealthy),
				pod(echoNS, "e3", west, podWest2, echoKey)},
			want: netip.AddrPortFrom(podWest2, 15008)},
		{name: "service with a waypoint goes to the waypoint pod's HBONE port",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global, waypointHost("infra", "wp.infra.svc.cluster.local", 15008)),
				pod(echoNS, "e1", west, podWest, echoKey), wpSvc, wpPodWest},
			want: netip.AddrPortFrom(wpPod, 15008), wantWp: true},
		{name: "waypoint by address of its pod",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global, waypointAddr(west, wpPod, 15009)),
				pod(echoNS, "e1", west, podWest, echoKey), wpSvc, wpPodWest},
			want: netip.AddrPortFrom(wpPod, 15009), wantWp: true},
		{name: "waypoint by its service VIP",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global, waypointAddr(west, wpVIP, 15008)),
				pod(echoNS, "e1", west, podWest, echoKey), wpSvc, wpPodWest},
			want: netip.AddrPortFrom(wpPod, 15008), wantWp: true},
		{name: "waypoint without a pod on our network: refused, not bypassed",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global, waypointHost("infra", "wp.infra.svc.cluster.local", 15008)),
				pod(echoNS, "e1", west, podWest, echoKey), wpSvc, pod("infra", "wp-2", east, podEast, "infra/wp.infra.svc.cluster.local")},
			err: ErrWaypoint},
		{name: "waypoint address on another network: refused",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global, waypointAddr(east, podEast, 15008)),
				pod(echoNS, "e1", west, podWest, echoKey)},
			err: ErrWaypoint},
		{name: "unknown waypoint service: refused",
			res: []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, global, waypointHost("infra", "gone.infra.svc.cluster.local", 15008)),
				pod(echoNS, "e1", west, podWest, echoKey)},
			err: ErrWaypoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := store(t, tc.res...).Load()
			host, port := tc.host, tc.port
			if host == "" {
				host = echoSvc
			}
			if port == 0 {
				port = 80
			}
			for draw := 0; draw < 64; draw++ {
				d, err := Route(snap, Scope{Network: west}, host, port, func(n int) int { return draw % n })
				if tc.err != nil {
					if !errors.Is(err, tc.err) {
						t.Fatalf("err = %v, want %v", err, tc.err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if d.Addr != tc.want || d.Waypoint != tc.wantWp {
					t.Fatalf("draw %d: dial %s (waypoint %v), want %s (waypoint %v)", draw, d.Addr, d.Waypoint, tc.want, tc.wantWp)
				}
				if d.Service == nil || d.Service.Key != echoKey {
					t.Fatalf("service %+v, want %s", d.Service, echoKey)
				}
			}
		})
	}
}

// TestRouteAmbiguousHostname: two global services of one hostname (two
// ServiceEntries) are refused unless the hostname is a Kubernetes one that
// names the namespace.
func TestRouteAmbiguousHostname(t *testing.T) {
	const host = "api.example.com"
	snap := store(t, service("a", "api", host, vip, global), service("b", "api", host, wpVIP, global),
		pod("a", "p", west, podWest, "a/"+host)).Load()
	if _, err := Route(snap, Scope{Network: west}, host, 80, nil); !errors.Is(err, ErrAmbiguousHost) {
		t.Fatalf("err = %v, want ErrAmbiguousHost", err)
	}
	k8s := "x.a.svc.cluster.local"
	snap = store(t, service("a", "x", k8s, vip, global), service("b", "x", k8s, wpVIP, global),
		pod("a", "p", west, podWest, "a/"+k8s)).Load()
	d, err := Route(snap, Scope{Network: west}, k8s, 80, nil)
	if err != nil || d.Service.Namespace != "a" {
		t.Fatalf("route = %+v, %v; want the service in namespace a", d, err)
	}
}

// TestStatusAndReason: refusals that reveal nothing about the service are
// 404, the ones about reachability 503, and each has its own label.
func TestStatusAndReason(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		reason string
	}{
		{ErrUnknownHost, 404, "unknown_host"},
		{ErrNotGlobal, 404, "not_global"},
		{ErrUnknownPort, 404, "unknown_port"},
		{ErrAmbiguousHost, 503, "ambiguous_host"},
		{ErrNoEndpoint, 503, "no_endpoint"},
		{ErrWaypoint, 503, "waypoint_unreachable"},
	} {
		if s, r := Status(tc.err), Reason(tc.err); s != tc.status || r != tc.reason {
			t.Errorf("%v: status %d reason %q, want %d %q", tc.err, s, r, tc.status, tc.reason)
		}
	}
}
