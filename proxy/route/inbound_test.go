package route

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestInbound: the destination pod's decision for one CONNECT, without
// sockets. An address authority must be the arrival address unless the
// pod is the waypoint of what it names (a service VIP: primary or weighted
// waypoint, by hostname or by address; a workload IP) or has an
// application tunnel; a hostname authority picks among the services of
// that name one the pod serves (its own namespace's first, a sandwiched
// waypoint's by its service) and maps the port; the proxy's own ports are
// refused as a target and as an application tunnel's port. Authorization
// sees the peer going to the upstream the app is dialled at.
func TestInbound(t *testing.T) {
	const shared = "shared.example.com"
	k := pt.ServiceKey
	entry := func(ns string, ports []uint32, opts ...pt.ServiceOpt) *workloadapi.Address {
		a := pt.Service(ns, "se", "", ports, opts...)
		a.GetService().Hostname = shared
		return a
	}
	tunnel := func(port uint32) pt.WorkloadOpt {
		return func(w *workloadapi.Workload) {
			w.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_PROXY, Port: port}
		}
	}
	s := state.NewStore()
	pt.Apply(t, s,
		pt.Pod("apps", "both", "10.0.0.1", pt.InService("apps/"+shared, 80, 8080), pt.InService("other/"+shared, 80, 9090)),
		pt.Pod("apps", "remote-only", "10.0.0.2", pt.InService("other/"+shared, 80, 9090)),
		pt.Pod("apps", "wp", "10.0.0.3", pt.InService(k("apps", "wp"), 15008, 15008)),
		pt.Pod("apps", "behind", "10.0.0.4", pt.WorkloadWaypoint(pt.WaypointIP("10.0.0.3"))),
		pt.Pod("apps", "tunnelled", "10.0.0.5", tunnel(15088)),
		pt.Pod("apps", "looping", "10.0.0.6", tunnel(15008)),
		entry("apps", []uint32{80, 8080}),
		entry("other", []uint32{80, 0}),
		pt.Service("apps", "wp", "10.96.0.9", []uint32{15008, 15008}),
		pt.Service("apps", "guarded", "10.96.0.10", []uint32{80, 8080}, pt.ServiceWaypoint(pt.WaypointHost("apps", "wp"))),
		pt.Service("apps", "canaried", "10.96.0.11", []uint32{80, 8081}, func(svc *workloadapi.Service) {
			svc.WeightedWaypoints = []*workloadapi.WeightedWaypoint{{Destination: pt.WaypointHost("apps", "wp"), Weight: 1}}
		}),
		pt.Service("apps", "by-vip", "10.96.0.12", []uint32{80, 8080}, pt.ServiceWaypoint(pt.WaypointIP("10.96.0.9"))),
		pt.Service("apps", "unguarded", "10.96.0.13", []uint32{80, 8080}),
	)
	snap := s.Load()
	peer := Peer{Addr: netip.MustParseAddrPort("10.0.9.9:40000"), Identity: identity.MustNew("cluster.local", "apps", "client")}
	for _, tc := range []struct {
		name      string
		local     string
		authority string // ip:port, or host:port with host
		host      string
		target    string // "": refused
		upstream  string
		service   string // key of the hostname's service
		waypoint  bool
		wantErr   error
	}{
		{"its own address", "both", "10.0.0.1:8080", "", "10.0.0.1:8080", "10.0.0.1:8080", "", false, nil},
		{"another pod's address", "both", "10.0.0.2:8080", "", "", "", "", false, ErrAuthorityMismatch},
		{"a VIP it is not the waypoint of", "wp", "10.96.0.13:80", "", "", "", "", false, ErrAuthorityMismatch},
		{"waypoint of the service (hostname)", "wp", "10.96.0.10:80", "", "10.96.0.10:80", "10.0.0.3:80", "", true, nil},
		{"weighted waypoint of the service", "wp", "10.96.0.11:80", "", "10.96.0.11:80", "10.0.0.3:80", "", true, nil},
		{"waypoint named by its service's VIP", "wp", "10.96.0.12:80", "", "10.96.0.12:80", "10.0.0.3:80", "", true, nil},
		{"waypoint of the workload", "wp", "10.0.0.4:8080", "", "10.0.0.4:8080", "10.0.0.3:8080", "", true, nil},
		{"a proxy port", "both", "10.0.0.1:15008", "", "", "", "", false, ErrIllegalPort},
		{"application tunnel: its own port, any authority", "tunnelled", "10.96.0.13:80", "", "10.96.0.13:80", "10.0.0.5:15088", "", false, nil},
		{"application tunnel on a proxy port", "looping", "10.0.0.6:80", "", "", "", "", false, ErrIllegalPort},
		{"own namespace first", "both", "0.0.0.0:80", shared, "10.0.0.1:8080", "10.0.0.1:8080", "apps/" + shared, false, nil},
		{"another namespace's entry when the pod serves only that", "remote-only", "0.0.0.0:80", shared, "10.0.0.2:9090", "10.0.0.2:9090", "other/" + shared, false, nil},
		{"hostname of a service it is the waypoint of", "wp", "0.0.0.0:80", pt.Hostname("apps", "guarded"), "10.0.0.3:8080", "10.0.0.3:8080", k("apps", "guarded"), false, nil},
		{"hostname of a service it is a weighted waypoint of", "wp", "0.0.0.0:80", pt.Hostname("apps", "canaried"), "10.0.0.3:8081", "10.0.0.3:8081", k("apps", "canaried"), false, nil},
		{"hostname not served here", "remote-only", "0.0.0.0:80", pt.Hostname("apps", "guarded"), "", "", "", false, ErrNotLocalHostname},
		{"no such name", "both", "0.0.0.0:80", "nope.example.com", "", "", "", false, ErrUnknownHostname},
		{"port not in the service", "both", "0.0.0.0:81", shared, "", "", "", false, ErrNoTargetPort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local := snap.WorkloadByUID(pt.UID("apps", tc.local))
			arrival := Arrival{Workload: local, Addr: netip.AddrPortFrom(local.Addresses[0], HBONEPort)}
			d, err := Inbound(snap, arrival, Authority{Addr: netip.MustParseAddrPort(tc.authority), Host: tc.host}, peer)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			svc := ""
			if d.Service != nil {
				svc = d.Service.Key
			}
			if d.Target.String() != tc.target || d.Upstream.String() != tc.upstream || svc != tc.service || d.Waypoint != tc.waypoint {
				t.Fatalf("= target %s upstream %s service %q waypoint %v; want %s %s %q %v", d.Target, d.Upstream, svc, d.Waypoint,
					tc.target, tc.upstream, tc.service, tc.waypoint)
			}
			up := netip.MustParseAddrPort(tc.upstream)
			if c := d.Conn; c.SrcIP != peer.Addr.Addr() || c.SrcIdentity != peer.Identity || c.DstIP != up.Addr() || c.DstPort != up.Port() {
				t.Errorf("authorization sees %+v, want the peer to %s", c, up)
			}
		})
	}
}
