package state

import (
	"reflect"
	"unsafe"

	"net/netip"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// Builders for xDS protobufs: tests describe state the way istiod sends it.

type wopt func(*workloadapi.Workload)

// pod builds a HEALTHY HBONE pod Workload "uid-<name>" in ns with IP ip.
func pod(ns, name, ip string, opts ...wopt) *workloadapi.Address {
	w := &workloadapi.Workload{
		Uid:            "Kubernetes//Pod/" + ns + "/" + name,
		Name:           name,
		Namespace:      ns,
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		ServiceAccount: "sa-" + name,
		Node:           "node1",
	}
	if ip != "" {
		w.Addresses = [][]byte{netip.MustParseAddr(ip).AsSlice()}
	}
	for _, o := range opts {
		o(w)
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

func uid(ns, name string) string { return "Kubernetes//Pod/" + ns + "/" + name }

// inService makes the workload an endpoint of service key with servicePort→targetPort pairs.
func inService(key string, ports ...uint32) wopt {
	return func(w *workloadapi.Workload) {
		if w.Services == nil {
			w.Services = map[string]*workloadapi.PortList{}
		}
		pl := &workloadapi.PortList{}
		for i := 0; i+1 < len(ports); i += 2 {
			pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: ports[i], TargetPort: ports[i+1]})
		}
		w.Services[key] = pl
	}
}

func unhealthy() wopt {
	return func(w *workloadapi.Workload) { w.Status = workloadapi.WorkloadStatus_UNHEALTHY }
}
func onNode(n string) wopt  { return func(w *workloadapi.Workload) { w.Node = n } }
func network(n string) wopt { return func(w *workloadapi.Workload) { w.Network = n } }
func capacity(c uint32) wopt {
	return func(w *workloadapi.Workload) { w.Capacity = wrapperspb.UInt32(c) }
}
func policies(ks ...string) wopt {
	return func(w *workloadapi.Workload) { w.AuthorizationPolicies = ks }
}
func locality(region, zone, subzone string) wopt {
	return func(w *workloadapi.Workload) {
		w.Locality = &workloadapi.Locality{Region: region, Zone: zone, Subzone: subzone}
	}
}
func cluster(c string) wopt { return func(w *workloadapi.Workload) { w.ClusterId = c } }

type sopt func(*workloadapi.Service)

// svc builds a Service name.ns.svc.cluster.local with a VIP (if vip != "")
// and servicePort→targetPort pairs.
func svc(ns, name, vip string, ports ...uint32) *workloadapi.Address {
	return svcOpts(ns, name, vip, ports)
}

func svcOpts(ns, name, vip string, ports []uint32, opts ...sopt) *workloadapi.Address {
	s := &workloadapi.Service{Name: name, Namespace: ns, Hostname: name + "." + ns + ".svc.cluster.local"}
	if vip != "" {
		s.Addresses = []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(vip).AsSlice()}}
	}
	for i := 0; i+1 < len(ports); i += 2 {
		s.Ports = append(s.Ports, &workloadapi.Port{ServicePort: ports[i], TargetPort: ports[i+1]})
	}
	for _, o := range opts {
		o(s)
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}
}

func svcKey(ns, name string) string { return ns + "/" + name + "." + ns + ".svc.cluster.local" }

func lb(mode workloadapi.LoadBalancing_Mode, health workloadapi.LoadBalancing_HealthPolicy, prefs ...workloadapi.LoadBalancing_Scope) sopt {
	return func(s *workloadapi.Service) {
		s.LoadBalancing = &workloadapi.LoadBalancing{RoutingPreference: prefs, Mode: mode, HealthPolicy: health}
	}
}

func aliasExt(target string) sopt {
	return func(s *workloadapi.Service) {
		cfg, err := anypb.New(wrapperspb.String(target))
		if err != nil {
			panic(err)
		}
		s.Extensions = append(s.Extensions, &workloadapi.Extension{Name: ExternalNameAliasExtension, Config: cfg})
	}
}

// name returns the xDS resource name of an Address.
func name(a *workloadapi.Address) string {
	if w := a.GetWorkload(); w != nil {
		return w.GetUid()
	}
	s := a.GetService()
	return s.GetNamespace() + "/" + s.GetHostname()
}

func addrs(as ...*workloadapi.Address) map[string]*workloadapi.Address {
	m := make(map[string]*workloadapi.Address, len(as))
	for _, a := range as {
		m[name(a)] = a
	}
	return m
}

func mustApply(t testing.TB, s *Store, as ...*workloadapi.Address) {
	t.Helper()
	if err := s.ApplyAddresses(addrs(as...), nil); err != nil {
		t.Fatalf("ApplyAddresses: %v", err)
	}
}

func authz(ns, name string, scope securityapi.Scope, action securityapi.Action, rules ...*securityapi.Rule) *securityapi.Authorization {
	return &securityapi.Authorization{Name: name, Namespace: ns, Scope: scope, Action: action, Rules: rules}
}

func authzs(ps ...*securityapi.Authorization) map[string]*securityapi.Authorization {
	m := make(map[string]*securityapi.Authorization, len(ps))
	for _, p := range ps {
		m[p.GetNamespace()+"/"+p.GetName()] = p
	}
	return m
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// unsafeData is the address of a string's bytes, to check interning.
func unsafeData(s string) *byte { return unsafe.StringData(s) }

// sameMap reports whether two maps are the same map object.
func sameMap[K comparable, V any](a, b map[K]V) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}
