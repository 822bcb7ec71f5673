package eastwest

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// The test mesh: the gateway is on network "west"; "east" is the other
// network the clients come from.
const (
	west    = "west"
	east    = "east"
	echoNS  = "demo"
	echoSvc = "echo.demo.svc.cluster.local"
)

// svcOpt and wlOpt adjust the protos the helpers build.
type (
	svcOpt func(*workloadapi.Service)
	wlOpt  func(*workloadapi.Workload)
)

func global(s *workloadapi.Service) {
	s.Extensions = append(s.Extensions, &workloadapi.Extension{Name: state.GlobalScopeExtension})
}

// waypointHost binds the service to the waypoint service ns/host on port.
func waypointHost(ns, host string, port uint32) svcOpt {
	return func(s *workloadapi.Service) {
		s.Waypoint = &workloadapi.GatewayAddress{HboneMtlsPort: port,
			Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: ns, Hostname: host}}}
	}
}

// waypointAddr binds the service to the waypoint at ip on network.
func waypointAddr(network string, ip netip.Addr, port uint32) svcOpt {
	return func(s *workloadapi.Service) {
		s.Waypoint = &workloadapi.GatewayAddress{HboneMtlsPort: port,
			Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Network: network, Address: ip.AsSlice()}}}
	}
}

// service is ns/host with a VIP and port 80 → 8080.
func service(ns, name, host string, vip netip.Addr, opts ...svcOpt) *workloadapi.Address {
	s := &workloadapi.Service{Name: name, Namespace: ns, Hostname: host,
		Addresses: []*workloadapi.NetworkAddress{{Network: west, Address: vip.AsSlice()}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}
	for _, o := range opts {
		o(s)
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}
}

func tcpOnly(w *workloadapi.Workload)   { w.TunnelProtocol = workloadapi.TunnelProtocol_NONE }
func unhealthy(w *workloadapi.Workload) { w.Status = workloadapi.WorkloadStatus_UNHEALTHY }

// pod is an HBONE pod ns/name at ip on network, an endpoint of svcKey
// ("ns/host"; "" for none) on port 80 → 8080.
func pod(ns, name, network string, ip netip.Addr, svcKey string, opts ...wlOpt) *workloadapi.Address {
	w := &workloadapi.Workload{Uid: "Kubernetes//Pod/" + ns + "/" + name, Name: name, Namespace: ns, Network: network,
		Addresses: [][]byte{ip.AsSlice()}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, ServiceAccount: name,
		WorkloadType: workloadapi.WorkloadType_POD, WorkloadName: name}
	if svcKey != "" {
		w.Services = map[string]*workloadapi.PortList{svcKey: {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}}
	}
	for _, o := range opts {
		o(w)
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

// store builds a state store from resources, as a WDS push delivers them.
func store(t testing.TB, res ...*workloadapi.Address) *state.Store {
	t.Helper()
	m := map[string]*workloadapi.Address{}
	for _, r := range res {
		switch x := r.Type.(type) {
		case *workloadapi.Address_Service:
			m[x.Service.Namespace+"/"+x.Service.Hostname] = r
		case *workloadapi.Address_Workload:
			m[x.Workload.Uid] = r
		}
	}
	s := state.NewStore()
	if err := s.ApplyAddresses(m, nil); err != nil {
		t.Fatal(err)
	}
	return s
}
