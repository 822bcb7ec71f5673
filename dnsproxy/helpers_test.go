package dnsproxy

import (
	"fmt"
	"net/netip"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// Builders for xDS protobufs: tests describe state the way the control plane
// sends it and load it through state.Store.ApplyAddresses.

type wopt func(*workloadapi.Workload)

// podAddr builds a healthy pod workload ns/name with the given IPs.
func podAddr(ns, name string, ips []string, opts ...wopt) *workloadapi.Address {
	w := &workloadapi.Workload{
		Uid:               "Kubernetes//Pod/" + ns + "/" + name,
		Name:              name,
		Namespace:         ns,
		TunnelProtocol:    workloadapi.TunnelProtocol_HBONE,
		CanonicalName:     name + "-app",
		CanonicalRevision: "v1",
		Node:              "node0",
	}
	for _, ip := range ips {
		w.Addresses = append(w.Addresses, netip.MustParseAddr(ip).AsSlice())
	}
	for _, o := range opts {
		o(w)
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

// endpointOf makes the workload an endpoint of the service key ns/hostname.
func endpointOf(key string) wopt {
	return func(w *workloadapi.Workload) {
		if w.Services == nil {
			w.Services = map[string]*workloadapi.PortList{}
		}
		w.Services[key] = &workloadapi.PortList{Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}
	}
}

func unhealthy() wopt {
	return func(w *workloadapi.Workload) { w.Status = workloadapi.WorkloadStatus_UNHEALTHY }
}

func onNetwork(n string) wopt { return func(w *workloadapi.Workload) { w.Network = n } }

type sopt func(*workloadapi.Service)

// svcAddr builds a service ns/hostname with the given VIPs ("ip" or
// "network/ip").
func svcAddr(ns, hostname string, vips []string, opts ...sopt) *workloadapi.Address {
	s := &workloadapi.Service{Name: hostname, Namespace: ns, Hostname: hostname,
		Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}
	for _, v := range vips {
		network := ""
		for i := 0; i < len(v); i++ {
			if v[i] == '/' {
				network, v = v[:i], v[i+1:]
				break
			}
		}
		s.Addresses = append(s.Addresses, &workloadapi.NetworkAddress{Network: network, Address: netip.MustParseAddr(v).AsSlice()})
	}
	for _, o := range opts {
		o(s)
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}
}

func families(f workloadapi.IPFamilies) sopt {
	return func(s *workloadapi.Service) { s.IpFamilies = f }
}

func canonical() sopt { return func(s *workloadapi.Service) { s.Canonical = true } }

func namespaceVisible() sopt {
	return func(s *workloadapi.Service) { s.Visibility = workloadapi.Service_NAMESPACE }
}

// aliasOf marks the service as an ExternalName alias of target, the way
// our control plane does (no addresses, no ports, the extension).
func aliasOf(t testing.TB, target string) sopt {
	cfg, err := anypb.New(wrapperspb.String(target))
	if err != nil {
		t.Fatal(err)
	}
	return func(s *workloadapi.Service) {
		s.Addresses, s.Ports = nil, nil
		s.Extensions = []*workloadapi.Extension{{Name: state.ExternalNameAliasExtension, Config: cfg}}
	}
}

// newStore applies the resources as one WDS update.
func newStore(t testing.TB, addrs ...*workloadapi.Address) *state.Store {
	t.Helper()
	st := state.NewStore()
	apply(t, st, addrs...)
	return st
}

func apply(t testing.TB, st *state.Store, addrs ...*workloadapi.Address) {
	t.Helper()
	m := make(map[string]*workloadapi.Address, len(addrs))
	for _, a := range addrs {
		if w := a.GetWorkload(); w != nil {
			m[w.Uid] = a
		} else {
			s := a.GetService()
			m[s.Namespace+"/"+s.Hostname] = a
		}
	}
	if err := st.ApplyAddresses(m, nil); err != nil {
		t.Fatal(err)
	}
}

// manyEndpoints is a headless service ns/name.ns.svc.cluster.local with n
// healthy endpoints 10.2.<i/250>.<i%250+1>.
func manyEndpoints(ns, name string, n int) []*workloadapi.Address {
	host := name + "." + ns + ".svc.cluster.local"
	out := []*workloadapi.Address{svcAddr(ns, host, nil)}
	for i := 0; i < n; i++ {
		ip := netip.AddrFrom4([4]byte{10, 2, byte(i / 250), byte(i%250 + 1)})
		out = append(out, podAddr(ns, fmt.Sprintf("%s-%d", name, i), []string{ip.String()}, endpointOf(ns+"/"+host)))
	}
	return out
}
