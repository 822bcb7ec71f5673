// Package proxytest builds the xDS protobufs (WDS workloads and services,
// L4 authorizations) that tests of the node proxy describe their mesh with,
// the way istiod would send them, and applies them to a state.Store.
//
// It is test support for proxy/ and e2e/ only: it holds no state, runs no
// control plane and is never imported by production code.
package proxytest

import (
	"net/netip"
	"testing"

	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// Cluster is the cluster id every builder uses.
const Cluster = "Kubernetes"

// WorkloadOpt changes a Workload built by Pod.
type WorkloadOpt func(*workloadapi.Workload)

// UID is the WDS uid of pod ns/name.
func UID(ns, name string) string { return Cluster + "//Pod/" + ns + "/" + name }

// Pod builds a healthy HBONE pod workload ns/name with IP ip (none when
// ""), service account "sa-<name>", on node "node0", canonical service
// <name> v1, workload name <name>.
func Pod(ns, name, ip string, opts ...WorkloadOpt) *workloadapi.Address {
	w := &workloadapi.Workload{
		Uid:               UID(ns, name),
		Name:              name,
		Namespace:         ns,
		TunnelProtocol:    workloadapi.TunnelProtocol_HBONE,
		ServiceAccount:    "sa-" + name,
		Node:              "node0",
		CanonicalName:     name,
		CanonicalRevision: "v1",
		WorkloadName:      name,
		WorkloadType:      workloadapi.WorkloadType_POD,
		ClusterId:         Cluster,
	}
	if ip != "" {
		w.Addresses = [][]byte{netip.MustParseAddr(ip).AsSlice()}
	}
	for _, o := range opts {
		o(w)
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

// InService makes the workload an endpoint of the service key with
// servicePort, targetPort pairs.
func InService(key string, ports ...uint32) WorkloadOpt {
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

// OnNode sets the workload's node.
func OnNode(node string) WorkloadOpt { return func(w *workloadapi.Workload) { w.Node = node } }

// ServiceAccount sets the workload's service account.
func ServiceAccount(sa string) WorkloadOpt {
	return func(w *workloadapi.Workload) { w.ServiceAccount = sa }
}

// Plaintext makes the workload a non-HBONE one (TunnelProtocol NONE).
func Plaintext() WorkloadOpt {
	return func(w *workloadapi.Workload) { w.TunnelProtocol = workloadapi.TunnelProtocol_NONE }
}

// Unhealthy marks the workload not ready.
func Unhealthy() WorkloadOpt {
	return func(w *workloadapi.Workload) { w.Status = workloadapi.WorkloadStatus_UNHEALTHY }
}

// Policies lists WORKLOAD_SELECTOR policy keys ("ns/name") on the workload.
func Policies(keys ...string) WorkloadOpt {
	return func(w *workloadapi.Workload) { w.AuthorizationPolicies = append(w.AuthorizationPolicies, keys...) }
}

// WorkloadWaypoint sets the workload's waypoint to a gateway address.
func WorkloadWaypoint(g *workloadapi.GatewayAddress) WorkloadOpt {
	return func(w *workloadapi.Workload) { w.Waypoint = g }
}

// Network puts the workload on a network (default "", the local one).
func Network(network string) WorkloadOpt {
	return func(w *workloadapi.Workload) { w.Network = network }
}

// NetworkGateway sets the gateway that reaches the workload from other
// networks (double HBONE).
func NetworkGateway(g *workloadapi.GatewayAddress) WorkloadOpt {
	return func(w *workloadapi.Workload) { w.NetworkGateway = g }
}

// GatewayIP is a network gateway named by address ip on network, with its
// HBONE port.
func GatewayIP(network, ip string, port uint32) *workloadapi.GatewayAddress {
	return &workloadapi.GatewayAddress{
		Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{
			Network: network, Address: netip.MustParseAddr(ip).AsSlice(),
		}},
		HboneMtlsPort: port,
	}
}

// GatewayHost is a network gateway named by the service ns/name, with its
// HBONE port.
func GatewayHost(ns, name string, port uint32) *workloadapi.GatewayAddress {
	g := WaypointHost(ns, name)
	g.HboneMtlsPort = port
	return g
}

// Locality sets region and zone.
func Locality(region, zone string) WorkloadOpt {
	return func(w *workloadapi.Workload) { w.Locality = &workloadapi.Locality{Region: region, Zone: zone} }
}

// WaypointHost is a gateway named by the service ns/name (hostname
// name.ns.svc.cluster.local) on HBONE port 15008.
func WaypointHost(ns, name string) *workloadapi.GatewayAddress {
	return &workloadapi.GatewayAddress{
		Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{
			Namespace: ns, Hostname: Hostname(ns, name),
		}},
		HboneMtlsPort: 15008,
	}
}

// WaypointIP is a gateway named by address on HBONE port 15008.
func WaypointIP(ip string) *workloadapi.GatewayAddress {
	return &workloadapi.GatewayAddress{
		Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{
			Address: netip.MustParseAddr(ip).AsSlice(),
		}},
		HboneMtlsPort: 15008,
	}
}

// ServiceOpt changes a Service built by Service.
type ServiceOpt func(*workloadapi.Service)

// Hostname is the cluster hostname of service ns/name.
func Hostname(ns, name string) string { return name + "." + ns + ".svc.cluster.local" }

// ServiceKey is the xDS resource name of service ns/name.
func ServiceKey(ns, name string) string { return ns + "/" + Hostname(ns, name) }

// Service builds service ns/name with VIP vip (none when "") and
// servicePort, targetPort pairs.
func Service(ns, name, vip string, ports []uint32, opts ...ServiceOpt) *workloadapi.Address {
	s := &workloadapi.Service{Name: name, Namespace: ns, Hostname: Hostname(ns, name)}
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

// ServiceWaypoint sets the service's waypoint.
func ServiceWaypoint(g *workloadapi.GatewayAddress) ServiceOpt {
	return func(s *workloadapi.Service) { s.Waypoint = g }
}

// SANs sets the service's subject alt names (SPIFFE ids).
func SANs(ids ...string) ServiceOpt {
	return func(s *workloadapi.Service) { s.SubjectAltNames = ids }
}

// Name is the xDS resource name of an Address.
func Name(a *workloadapi.Address) string {
	if w := a.GetWorkload(); w != nil {
		return w.GetUid()
	}
	s := a.GetService()
	return s.GetNamespace() + "/" + s.GetHostname()
}

// Addresses keys addresses by resource name.
func Addresses(as ...*workloadapi.Address) map[string]*workloadapi.Address {
	m := make(map[string]*workloadapi.Address, len(as))
	for _, a := range as {
		m[Name(a)] = a
	}
	return m
}

// Apply applies addresses to s and fails t on a rejected resource.
func Apply(t testing.TB, s *state.Store, as ...*workloadapi.Address) {
	t.Helper()
	if err := s.ApplyAddresses(Addresses(as...), nil); err != nil {
		t.Fatalf("ApplyAddresses: %v", err)
	}
}

// ApplyPolicies upserts policies into s and fails t on a rejected one.
func ApplyPolicies(t testing.TB, s *state.Store, ps ...*securityapi.Authorization) {
	t.Helper()
	m := make(map[string]*securityapi.Authorization, len(ps))
	for _, p := range ps {
		m[p.GetNamespace()+"/"+p.GetName()] = p
	}
	if err := s.ApplyAuthorizations(m, nil); err != nil {
		t.Fatalf("ApplyAuthorizations: %v", err)
	}
}

// RemovePolicies removes policies by key ("ns/name").
func RemovePolicies(t testing.TB, s *state.Store, keys ...string) {
	t.Helper()
	if err := s.ApplyAuthorizations(nil, keys); err != nil {
		t.Fatalf("ApplyAuthorizations: %v", err)
	}
}

// Policy builds a NAMESPACE-scoped policy ns/name (istiod's scope for a
// selector-less policy outside the root namespace).
func Policy(ns, name string, action securityapi.Action, rules ...*securityapi.Rule) *securityapi.Authorization {
	return &securityapi.Authorization{Name: name, Namespace: ns, Scope: securityapi.Scope_NAMESPACE, Action: action, Rules: rules}
}

// Rule is a rule whose clauses each hold one match (all must hold).
func Rule(matches ...*securityapi.Match) *securityapi.Rule {
	r := &securityapi.Rule{}
	for _, m := range matches {
		r.Clauses = append(r.Clauses, &securityapi.Clause{Matches: []*securityapi.Match{m}})
	}
	return r
}

// Principals matches peers whose identity (without "spiffe://") is one of
// ids exactly.
func Principals(ids ...string) *securityapi.Match {
	m := &securityapi.Match{}
	for _, id := range ids {
		m.Principals = append(m.Principals, &securityapi.StringMatch{MatchType: &securityapi.StringMatch_Exact{Exact: id}})
	}
	return m
}

// NotPrincipalsPresence is istiod's static STRICT policy match: any
// connection without a peer identity.
func NotPrincipalsPresence() *securityapi.Match {
	return &securityapi.Match{NotPrincipals: []*securityapi.StringMatch{
		{MatchType: &securityapi.StringMatch_Presence{Presence: &emptypb.Empty{}}},
	}}
}

// Ports matches destination ports.
func Ports(ports ...uint32) *securityapi.Match {
	return &securityapi.Match{DestinationPorts: ports}
}

// StrictPolicy is istiod's static policy for PeerAuthentication STRICT
// (<rootns>/istio_converted_static_strict, DENY not_principals presence);
// list its key on the workloads whose mode is STRICT.
func StrictPolicy(rootNS string) *securityapi.Authorization {
	return &securityapi.Authorization{
		Name: "istio_converted_static_strict", Namespace: rootNS,
		Scope: securityapi.Scope_WORKLOAD_SELECTOR, Action: securityapi.Action_DENY,
		Rules: []*securityapi.Rule{Rule(NotPrincipalsPresence())},
	}
}
