package state

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// FuzzApplyAddresses decodes arbitrary bytes as an Address and applies it on
// top of a small mesh. It must never panic; a rejection must name the
// resource; an accepted resource must be findable, usable by the lookups, and
// removable by name.
func FuzzApplyAddresses(f *testing.F) {
	seeds := []*workloadapi.Address{
		pod("ns", "a", "10.0.0.1", inService(svcKey("ns", "web"), 80, 8080), policies("ns/p"), locality("r", "z", "s")),
		pod("ns", "v6", "fd00::1", network("n2"), func(w *workloadapi.Workload) {
			w.Waypoint = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{
				Address: &workloadapi.NetworkAddress{Address: []byte{10, 0, 0, 9}}}}
		}),
		pod("ns", "bad", "10.0.0.1", func(w *workloadapi.Workload) { w.Addresses = [][]byte{{1}} }),
		pod("ns", "legacy", "10.0.0.1", func(w *workloadapi.Workload) { w.TunnelProtocol = 2 }),
		svcOpts("ns", "web", "10.96.0.1", []uint32{80, 8080, 9090, 0}, lb(workloadapi.LoadBalancing_FAILOVER, 0, workloadapi.LoadBalancing_ZONE), aliasExt("x.example")),
		svcOpts("ns", "cidr", "", nil, func(s *workloadapi.Service) {
			s.Addresses = []*workloadapi.NetworkAddress{{Address: []byte{10, 97, 0, 0}, Length: new(uint32(16))}}
		}),
		{},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var a workloadapi.Address
		if err := proto.Unmarshal(data, &a); err != nil {
			return
		}
		s := NewStore()
		mustApply(t, s,
			pod("ns", "base", "10.0.0.1", inService(svcKey("ns", "web"), 80, 8080)),
			svc("ns", "web", "10.96.0.1", 80, 8080))
		resName := "fuzz-resource"
		switch {
		case a.GetWorkload() != nil:
			resName = a.GetWorkload().GetUid()
		case a.GetService() != nil:
			resName = a.GetService().GetNamespace() + "/" + a.GetService().GetHostname()
		}
		err := s.ApplyAddresses(map[string]*workloadapi.Address{resName: &a}, nil)
		snap := s.Load()
		if err != nil {
			var ae *ApplyError
			if !errors.As(err, &ae) || len(ae.Errors) != 1 || ae.Errors[0].Resource != resName ||
				!strings.Contains(err.Error(), "resource "+resName+": ") {
				t.Fatalf("rejection does not name resource %q: %v", resName, err)
			}
			if snap.Generation != 1 {
				t.Fatalf("a rejected resource published a snapshot")
			}
			return
		}
		// Accepted: usable by every reader.
		switch {
		case a.GetWorkload() != nil:
			w := snap.WorkloadByUID(resName)
			if w == nil {
				t.Fatalf("accepted workload %q not found", resName)
			}
			for _, ip := range w.Addresses {
				snap.WorkloadByIP(w.Network, ip)
			}
			snap.PoliciesFor(w)
			snap.WorkloadsOnNode(w.Node)
			snap.SelectEndpoint(snap.ServiceByHost(svcKey("ns", "web")), 80, w, nil)
		default:
			sv := snap.ServiceByHost(resName)
			if sv == nil {
				t.Fatalf("accepted service %q not found", resName)
			}
			for _, v := range sv.VIPs {
				snap.ServiceByVIP(v.Network, v.Prefix.Addr(), sv.Namespace)
			}
			snap.ServicesByHostname(sv.Hostname)
			snap.SelectEndpoint(sv, 80, snap.WorkloadByUID(uid("ns", "base")), func(n int) int { return n - 1 })
		}
		if _, err := json.Marshal(snap.Dump()); err != nil {
			t.Fatalf("dump: %v", err)
		}
		if err := s.ApplyAddresses(nil, []string{resName}); err != nil {
			t.Fatal(err)
		}
		if snap := s.Load(); snap.WorkloadByUID(resName) != nil || snap.ServiceByHost(resName) != nil {
			t.Fatalf("%q not removed", resName)
		}
	})
}
