package state

import (
	"errors"
	"maps"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// TestSelectEndpoint drives every draw of the weighted random choice (rnd
// returns each r in [0, total)) and counts which endpoint each draw picks, so
// rows state the exact weights.
func TestSelectEndpoint(t *testing.T) {
	const web = "ns/web.ns.svc.cluster.local"
	const (
		strict   = workloadapi.LoadBalancing_STRICT
		failover = workloadapi.LoadBalancing_FAILOVER
		onlyH    = workloadapi.LoadBalancing_ONLY_HEALTHY
		allowAll = workloadapi.LoadBalancing_ALLOW_ALL
		region   = workloadapi.LoadBalancing_REGION
		zone     = workloadapi.LoadBalancing_ZONE
		subzone  = workloadapi.LoadBalancing_SUBZONE
		node     = workloadapi.LoadBalancing_NODE
		netw     = workloadapi.LoadBalancing_NETWORK
		clus     = workloadapi.LoadBalancing_CLUSTER
	)
	ep := func(name string, opts ...wopt) *workloadapi.Address {
		return pod("ns", name, "10.0.0."+string(rune('0'+len(name)%10)), append([]wopt{inService(web, 80, 8080)}, opts...)...)
	}
	noMap := func(name string, opts ...wopt) *workloadapi.Address {
		return pod("ns", name, "10.0.1.1", append([]wopt{inService(web)}, opts...)...)
	}
	src := pod("client", "src", "10.9.0.1", onNode("n1"), locality("r1", "z1", "s1"), cluster("c1"))
	tests := []struct {
		name     string
		eps      []*workloadapi.Address
		svcPorts []uint32 // service_port, target_port pairs
		svcOpts  []sopt
		port     uint16
		src      *workloadapi.Address // nil = no source workload
		want     map[string]int       // name → number of draws picking it
		wantPort uint16
		wantErr  error
		gateway  bool // SelectGatewayEndpoint
	}{
		{name: "no endpoints", svcPorts: []uint32{80, 8080}, port: 80, wantErr: ErrNoEndpoints},
		{name: "plain", eps: []*workloadapi.Address{ep("a"), ep("bb")}, svcPorts: []uint32{80, 8080}, port: 80,
			want: map[string]int{"a": 1, "bb": 1}, wantPort: 8080},
		{name: "unhealthy skipped", eps: []*workloadapi.Address{ep("a"), ep("bb", unhealthy())}, svcPorts: []uint32{80, 8080}, port: 80,
			want: map[string]int{"a": 1}, wantPort: 8080},
		{name: "all unhealthy", eps: []*workloadapi.Address{ep("a", unhealthy())}, svcPorts: []uint32{80, 8080}, port: 80,
			wantErr: ErrNoHealthyEndpoint},
		{name: "ALLOW_ALL keeps unhealthy", eps: []*workloadapi.Address{ep("a"), ep("bb", unhealthy())}, svcPorts: []uint32{80, 8080},
			svcOpts: []sopt{lb(0, allowAll)}, port: 80, want: map[string]int{"a": 1, "bb": 1}, wantPort: 8080},
		{name: "named port only from the endpoint map", eps: []*workloadapi.Address{ep("a"), noMap("bb")}, svcPorts: []uint32{80, 0}, port: 80,
			want: map[string]int{"a": 1}, wantPort: 8080},
		{name: "named port nobody resolves", eps: []*workloadapi.Address{noMap("bb")}, svcPorts: []uint32{80, 0}, port: 80,
			wantErr: ErrUnknownPort},
		{name: "service target port when the map lacks the port", eps: []*workloadapi.Address{noMap("bb")}, svcPorts: []uint32{80, 9090}, port: 80,
			want: map[string]int{"bb": 1}, wantPort: 9090},
		{name: "endpoint map wins over service target", eps: []*workloadapi.Address{ep("a")}, svcPorts: []uint32{80, 9090}, port: 80,
			want: map[string]int{"a": 1}, wantPort: 8080},
		{name: "port the service does not declare", eps: []*workloadapi.Address{noMap("bb")}, svcPorts: []uint32{80, 9090}, port: 81,
			wantErr: ErrUnknownPort},
		{name: "application tunnel falls back to the service port", eps: []*workloadapi.Address{noMap("bb", func(w *workloadapi.Workload) {
			w.ApplicationTunnel = &workloadapi.ApplicationTunnel{}
		})}, svcPorts: []uint32{80, 0}, port: 80, want: map[string]int{"bb": 1}, wantPort: 80},
		{name: "unreachable (no IP, no hostname) skipped", eps: []*workloadapi.Address{ep("a"),
			pod("ns", "noip", "", inService(web, 80, 8080))}, svcPorts: []uint32{80, 8080}, port: 80,
			want: map[string]int{"a": 1}, wantPort: 8080},
		{name: "hostname-only endpoint is reachable", eps: []*workloadapi.Address{
			pod("ns", "dns", "", inService(web, 80, 8080), func(w *workloadapi.Workload) { w.Hostname = "vm.example.com" })},
			svcPorts: []uint32{80, 8080}, port: 80, src: src, want: map[string]int{"dns": 1}, wantPort: 8080},
		{name: "remote network behind a gateway is reachable", eps: []*workloadapi.Address{
			pod("ns", "remote", "", inService(web, 80, 8080), network("net2"), func(w *workloadapi.Workload) {
				w.NetworkGateway = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{
					Address: &workloadapi.NetworkAddress{Network: "net2", Address: []byte{1, 1, 1, 1}}}}
			})}, svcPorts: []uint32{80, 8080}, port: 80, src: src, want: map[string]int{"remote": 1}, wantPort: 8080},
		{name: "remote network with an address but no gateway is skipped", eps: []*workloadapi.Address{ep("a"),
			ep("bb", network("net2"))}, svcPorts: []uint32{80, 8080}, port: 80, src: src,
			want: map[string]int{"a": 1}, wantPort: 8080},
		{name: "remote network only, no gateway: no healthy upstream", eps: []*workloadapi.Address{ep("bb", network("net2"))},
			svcPorts: []uint32{80, 8080}, port: 80, src: src, wantErr: ErrNoHealthyEndpoint},
		{name: "remote network with an address and a gateway is reachable", eps: []*workloadapi.Address{ep("a"),
			ep("bb", network("net2"), func(w *workloadapi.Workload) {
				w.NetworkGateway = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{
					Address: &workloadapi.NetworkAddress{Network: "net2", Address: []byte{1, 1, 1, 1}}}}
			})}, svcPorts: []uint32{80, 8080}, port: 80, src: src,
			want: map[string]int{"a": 1, "bb": 1}, wantPort: 8080},
		{name: "a network gateway's own endpoints are on the remote network", eps: []*workloadapi.Address{ep("bb", network("net2"))},
			svcPorts: []uint32{80, 8080}, port: 80, src: src, gateway: true, want: map[string]int{"bb": 1}, wantPort: 8080},
		{name: "no source: no network to compare", eps: []*workloadapi.Address{ep("bb", network("net2"))},
			svcPorts: []uint32{80, 8080}, port: 80, want: map[string]int{"bb": 1}, wantPort: 8080},
		{name: "capacity weighting", eps: []*workloadapi.Address{ep("a", capacity(1)), ep("bb", capacity(3)), ep("ccc", capacity(0))},
			svcPorts: []uint32{80, 8080}, port: 80, want: map[string]int{"a": 1, "bb": 3}, wantPort: 8080},
		{name: "all capacity zero", eps: []*workloadapi.Address{ep("a", capacity(0))}, svcPorts: []uint32{80, 8080}, port: 80,
			wantErr: ErrNoHealthyEndpoint},
		{name: "STRICT node keeps same-node only", eps: []*workloadapi.Address{ep("a", onNode("n1")), ep("bb", onNode("n2"))},
			svcPorts: []uint32{80, 8080}, svcOpts: []sopt{lb(strict, onlyH, node)}, port: 80, src: src,
			want: map[string]int{"a": 1}, wantPort: 8080},
		{name: "STRICT with no full match", eps: []*workloadapi.Address{ep("bb", onNode("n2"))},
			svcPorts: []uint32{80, 8080}, svcOpts: []sopt{lb(strict, onlyH, node)}, port: 80, src: src,
			wantErr: ErrNoHealthyEndpoint},
		{name: "STRICT without a source matches nothing", eps: []*workloadapi.Address{ep("a", onNode("n1"))},
			svcPorts: []uint32{80, 8080}, svcOpts: []sopt{lb(strict, onlyH, node)}, port: 80,
			wantErr: ErrNoHealthyEndpoint},
		{name: "STRICT counts consecutive matches", eps: []*workloadapi.Address{
			ep("a", locality("r1", "z2", "s1")), // region ok, zone no: rank 1 even though subzone matches
			ep("bb", locality("r1", "z1", "s1")),
		}, svcPorts: []uint32{80, 8080}, svcOpts: []sopt{lb(strict, onlyH, region, zone, subzone)}, port: 80, src: src,
			want: map[string]int{"bb": 1}, wantPort: 8080},
		{name: "FAILOVER prefers the best rank", eps: []*workloadapi.Address{
			ep("a", locality("r2", "z1", "")), ep("bb", locality("r1", "z2", "")), ep("ccc", locality("r1", "z1", "")), ep("dddd", locality("r1", "z1", "")),
		}, svcPorts: []uint32{80, 8080}, svcOpts: []sopt{lb(failover, onlyH, netw, region, zone)}, port: 80, src: src,
			want: map[string]int{"ccc": 1, "dddd": 1}, wantPort: 8080},
		{name: "FAILOVER falls back to the next rank", eps: []*workloadapi.Address{
			ep("a", locality("r2", "z1", "")), ep("bb", locality("r1", "z2", "")), ep("ccc", locality("r1", "z1", ""), unhealthy()),
		}, svcPorts: []uint32{80, 8080}, svcOpts: []sopt{lb(failover, onlyH, netw, region, zone)}, port: 80, src: src,
			want: map[string]int{"bb": 1}, wantPort: 8080},
		{name: "FAILOVER network mismatch ranks 0", eps: []*workloadapi.Address{
			ep("a", network("net2"), locality("r1", "z1", "")), ep("bb", locality("r9", "", "")),
		}, svcPorts: []uint32{80, 8080}, svcOpts: []sopt{lb(failover, onlyH, netw, region)}, port: 80, src: src,
			want: map[string]int{"bb": 1}, wantPort: 8080},
		{name: "FAILOVER cluster then node", eps: []*workloadapi.Address{
			ep("a", cluster("c1"), onNode("n2")), ep("bb", cluster("c2"), onNode("n1")), ep("ccc", cluster("c1"), onNode("n1")),
		}, svcPorts: []uint32{80, 8080}, svcOpts: []sopt{lb(failover, onlyH, clus, node)}, port: 80, src: src,
			want: map[string]int{"ccc": 1}, wantPort: 8080},
		{name: "FAILOVER weights within the best rank", eps: []*workloadapi.Address{
			ep("a", onNode("n1"), capacity(2)), ep("bb", onNode("n1"), capacity(5)), ep("ccc", onNode("n2"), capacity(100)),
		}, svcPorts: []uint32{80, 8080}, svcOpts: []sopt{lb(failover, onlyH, node)}, port: 80, src: src,
			want: map[string]int{"a": 2, "bb": 5}, wantPort: 8080},
		{name: "unspecified mode ignores preferences", eps: []*workloadapi.Address{ep("a", onNode("n1")), ep("bb", onNode("n2"))},
			svcPorts: []uint32{80, 8080}, svcOpts: []sopt{lb(0, onlyH, node)}, port: 80, src: src,
			want: map[string]int{"a": 1, "bb": 1}, wantPort: 8080},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore()
			as := append([]*workloadapi.Address{svcOpts("ns", "web", "10.96.0.1", tt.svcPorts, tt.svcOpts...)}, tt.eps...)
			if tt.src != nil {
				as = append(as, tt.src)
			}
			mustApply(t, s, as...)
			snap := s.Load()
			service := snap.ServiceByHost(web)
			var srcW *Workload
			if tt.src != nil {
				srcW = snap.WorkloadByUID(name(tt.src))
			}
			sel := snap.SelectEndpoint
			if tt.gateway {
				sel = snap.SelectGatewayEndpoint
			}
			total := -1
			_, _, err := sel(service, tt.port, srcW, func(n int) int { total = n; return 0 })
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for r := 0; r < total; r++ {
				w, port, err := sel(service, tt.port, srcW, func(int) int { return r })
				if err != nil {
					t.Fatalf("draw %d: %v", r, err)
				}
				if port != tt.wantPort {
					t.Errorf("draw %d picked %s port %d, want port %d", r, w.Name, port, tt.wantPort)
				}
				got[w.Name]++
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("draws = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSelectEndpointNoAllocs(t *testing.T) {
	s := NewStore()
	const web = "ns/web.ns.svc.cluster.local"
	mustApply(t, s,
		svcOpts("ns", "web", "10.96.0.1", []uint32{80, 0}, lb(workloadapi.LoadBalancing_FAILOVER, 0,
			workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE)),
		pod("ns", "a", "10.0.0.1", inService(web, 80, 8080), locality("r", "z", "")),
		pod("ns", "b", "10.0.0.2", inService(web, 80, 8080), locality("r", "y", "")),
		pod("ns", "src", "10.0.0.3", locality("r", "z", "")),
	)
	snap := s.Load()
	service, src := snap.ServiceByHost(web), snap.WorkloadByIP("", ip("10.0.0.3"))
	rnd := func(n int) int { return n - 1 }
	allocs := testing.AllocsPerRun(1000, func() {
		if w, _, err := snap.SelectEndpoint(service, 80, src, rnd); err != nil || w.Name != "a" {
			t.Fatalf("picked %v, %v", w, err)
		}
	})
	if allocs != 0 {
		t.Errorf("SelectEndpoint allocates %v per call, want 0", allocs)
	}
	// The default rnd works too.
	if w, _, err := snap.SelectEndpoint(service, 80, src, nil); err != nil || w.Name != "a" {
		t.Errorf("default rnd: %v, %v", w, err)
	}
}
