package state

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

func uids(ws []*Workload) []string {
	out := []string{}
	for _, w := range ws {
		out = append(out, w.UID)
	}
	return out
}

func epUIDs(eps []Endpoint) []string {
	out := []string{}
	for _, e := range eps {
		out = append(out, e.Workload.UID)
	}
	slices.Sort(out)
	return out
}

func TestIndexes(t *testing.T) {
	s := NewStore()
	mustApply(t, s,
		pod("default", "a", "10.0.0.1", inService(svcKey("default", "web"), 80, 8080), onNode("n1")),
		pod("default", "b", "10.0.0.2", inService(svcKey("default", "web"), 80, 8080), onNode("n2")),
		pod("other", "c", "10.0.0.1", network("net2"), onNode("n1")),
		pod("default", "host", "10.0.0.9", func(w *workloadapi.Workload) { w.NetworkMode = workloadapi.NetworkMode_HOST_NETWORK }),
		svc("default", "web", "10.96.0.1", 80, 8080),
		svc("other", "web", "10.96.0.1", 80, 8080),
		// ServiceEntry host defined in two namespaces.
		&workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{Name: "se", Namespace: "a", Hostname: "api.example.com"}}},
		&workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{Name: "se", Namespace: "b", Hostname: "api.example.com"}}},
	)
	snap := s.Load()
	if snap.Generation != 1 {
		t.Errorf("Generation = %d, want 1", snap.Generation)
	}
	if n := snap.NumWorkloads(); n != 4 {
		t.Errorf("NumWorkloads = %d", n)
	}
	if w := snap.WorkloadByUID(uid("default", "a")); w == nil || w.Name != "a" {
		t.Fatalf("WorkloadByUID = %v", w)
	}
	tests := []struct {
		name    string
		network string
		ip      string
		want    string // uid, "" = nil
	}{
		{"default network", "", "10.0.0.1", uid("default", "a")},
		{"other network same IP", "net2", "10.0.0.1", uid("other", "c")},
		{"v4-mapped lookup", "", "::ffff:10.0.0.2", uid("default", "b")},
		{"unknown IP", "", "10.0.0.3", ""},
		{"wrong network", "net3", "10.0.0.1", ""},
		{"host network never by IP", "", "10.0.0.9", ""},
	}
	for _, tt := range tests {
		got := snap.WorkloadByIP(tt.network, ip(tt.ip))
		if (got == nil && tt.want != "") || (got != nil && got.UID != tt.want) {
			t.Errorf("%s: WorkloadByIP(%q, %s) = %v, want %q", tt.name, tt.network, tt.ip, got, tt.want)
		}
	}
	if w := snap.WorkloadByUID(uid("default", "host")); w == nil || !w.HostNetwork {
		t.Errorf("host-network workload must still be known by uid: %v", w)
	}
	if got := snap.ServiceByVIP("", ip("10.96.0.1"), "other"); got == nil || got.Namespace != "other" {
		t.Errorf("ServiceByVIP prefer other = %v", got)
	}
	if got := snap.ServiceByVIP("", ip("10.96.0.1"), "zzz"); got == nil || got.Namespace != "default" {
		t.Errorf("ServiceByVIP no preference match = %v, want smallest key", got)
	}
	if got := snap.ServiceByVIP("net2", ip("10.96.0.1"), ""); got != nil {
		t.Errorf("ServiceByVIP on other network = %v", got)
	}
	web := snap.ServiceByHost(svcKey("default", "web"))
	if web == nil || web.Hostname != "web.default.svc.cluster.local" {
		t.Fatalf("ServiceByHost = %v", web)
	}
	if got := snap.ServiceByNamespacedHostname("default", "web.default.svc.cluster.local"); got != web {
		t.Errorf("ServiceByNamespacedHostname = %v", got)
	}
	if got := snap.ServiceByHost("default/nope"); got != nil {
		t.Errorf("unknown ServiceByHost = %v", got)
	}
	var nss []string
	for _, s := range snap.ServicesByHostname("api.example.com") {
		nss = append(nss, s.Namespace)
	}
	if !slices.Equal(nss, []string{"a", "b"}) {
		t.Errorf("ServicesByHostname namespaces = %v", nss)
	}
	if got := uids(snap.WorkloadsOnNode("n1")); !slices.Equal(got, []string{uid("default", "a"), uid("other", "c")}) {
		t.Errorf("WorkloadsOnNode(n1) = %v", got)
	}
	if got := epUIDs(snap.Endpoints(web)); !slices.Equal(got, []string{uid("default", "a"), uid("default", "b")}) {
		t.Errorf("Endpoints(web) = %v", got)
	}
	if got := epUIDs(snap.Endpoints(snap.ServiceByHost(svcKey("other", "web")))); len(got) != 0 {
		t.Errorf("Endpoints(other/web) = %v, want none", got)
	}
}

func TestConversion(t *testing.T) {
	s := NewStore()
	mustApply(t, s,
		pod("ns", "full", "10.0.0.1", func(w *workloadapi.Workload) {
			w.Addresses = append(w.Addresses, netip.MustParseAddr("fd00::1").AsSlice(), netip.MustParseAddr("::ffff:10.0.0.5").AsSlice())
			w.TrustDomain = "example.org"
			w.ServiceAccount = ""
			w.NativeTunnel = true
			w.Waypoint = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{
				Hostname: &workloadapi.NamespacedHostname{Namespace: "ns", Hostname: "wp.ns.svc.cluster.local"}}}
			w.NetworkGateway = &workloadapi.GatewayAddress{HboneMtlsPort: 15009, Destination: &workloadapi.GatewayAddress_Address{
				Address: &workloadapi.NetworkAddress{Network: "net1", Address: []byte{1, 2, 3, 4}}}}
			w.WorkloadType = workloadapi.WorkloadType_JOB
			w.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_PROXY, Port: 15088}
			w.Locality = &workloadapi.Locality{Region: "r", Zone: "z", Subzone: "s"}
		}, inService("ns/b.example", 80, 0), inService("ns/a.example", 443, 8443), policies("ns/p1")),
		pod("ns", "defaults", "", func(w *workloadapi.Workload) { w.ServiceAccount = "" }),
		svcOpts("ns", "alias", "", []uint32{80, 80}, aliasExt("target.example.com"), func(s *workloadapi.Service) {
			s.SubjectAltNames = []string{"spiffe://cluster.local/ns/ns/sa/x", "not-a-spiffe-id"}
			s.Addresses = []*workloadapi.NetworkAddress{{Address: []byte{10, 97, 0, 0}, Length: new(uint32(16))}}
		}),
	)
	snap := s.Load()
	w := snap.WorkloadByUID(uid("ns", "full"))
	if got := w.Identity(); got != identity.MustNew("example.org", "ns", "default") {
		t.Errorf("Identity = %v (defaults applied?)", got)
	}
	if want := []netip.Addr{ip("10.0.0.1"), ip("fd00::1"), ip("10.0.0.5")}; !slices.Equal(w.Addresses, want) {
		t.Errorf("Addresses = %v, want %v", w.Addresses, want)
	}
	if w.Waypoint == nil || !w.Waypoint.IsHostname() || w.Waypoint.HBONEPort != DefaultHBONEPort {
		t.Errorf("Waypoint = %+v", w.Waypoint)
	}
	if g := w.NetworkGateway; g == nil || g.IsHostname() || g.Address.IP != ip("1.2.3.4") || g.Address.Network != "net1" || g.HBONEPort != 15009 {
		t.Errorf("NetworkGateway = %+v", g)
	}
	if w.WorkloadType != WorkloadJob || !w.NativeTunnel || w.Protocol != TunnelHBONE || !w.Healthy || w.Capacity != 1 {
		t.Errorf("workload = %+v", w)
	}
	if w.ApplicationTunnel == nil || *w.ApplicationTunnel != (ApplicationTunnel{Protocol: AppTunnelProxy, Port: 15088}) {
		t.Errorf("ApplicationTunnel = %+v", w.ApplicationTunnel)
	}
	if w.Locality != (Locality{"r", "z", "s"}) {
		t.Errorf("Locality = %+v", w.Locality)
	}
	if len(w.Services) != 2 || w.Services[0].Service != "ns/a.example" || w.PortsFor("ns/b.example")[0] != (PortMapping{80, 0}) {
		t.Errorf("Services = %+v (want sorted by key)", w.Services)
	}
	if d := snap.WorkloadByUID(uid("ns", "defaults")); d.Identity() != identity.MustNew("cluster.local", "ns", "default") || d.Addresses != nil {
		t.Errorf("defaults workload = %+v", d)
	}
	a := snap.ServiceByHost("ns/alias.ns.svc.cluster.local")
	if a.AliasOf != "target.example.com" || len(a.Extensions) != 1 {
		t.Errorf("AliasOf = %q, Extensions = %v", a.AliasOf, a.Extensions)
	}
	if len(a.SubjectAltNames) != 1 || a.SubjectAltNames[0] != identity.MustNew("cluster.local", "ns", "x") {
		t.Errorf("SubjectAltNames = %v (invalid ones dropped)", a.SubjectAltNames)
	}
	if got := snap.ServiceByVIP("", ip("10.97.3.4"), ""); got != a {
		t.Errorf("ServiceByVIP in CIDR VIP = %v", got)
	}
	if got := snap.ServiceByVIP("", ip("10.98.0.1"), ""); got != nil {
		t.Errorf("ServiceByVIP outside CIDR VIP = %v", got)
	}
	// Interning: equal strings share storage across workloads.
	if unsafeData(w.Namespace) != unsafeData(snap.WorkloadByUID(uid("ns", "defaults")).Namespace) {
		t.Errorf("namespace strings are not interned")
	}
}

func TestRemoveByName(t *testing.T) {
	s := NewStore()
	mustApply(t, s,
		pod("ns", "a", "10.0.0.1", inService(svcKey("ns", "web"), 80, 8080), onNode("n1")),
		pod("ns", "b", "10.0.0.2", inService(svcKey("ns", "web"), 80, 8080), onNode("n1")),
		svc("ns", "web", "10.96.0.1", 80, 8080),
	)
	before := s.Load()
	if err := s.ApplyAddresses(nil, []string{uid("ns", "a"), svcKey("ns", "web"), "never/existed"}); err != nil {
		t.Fatal(err)
	}
	snap := s.Load()
	if snap.WorkloadByUID(uid("ns", "a")) != nil || snap.WorkloadByIP("", ip("10.0.0.1")) != nil {
		t.Errorf("workload a still present")
	}
	if snap.ServiceByHost(svcKey("ns", "web")) != nil || snap.ServiceByVIP("", ip("10.96.0.1"), "") != nil ||
		len(snap.ServicesByHostname("web.ns.svc.cluster.local")) != 0 {
		t.Errorf("service web still present")
	}
	if got := epUIDs(snap.EndpointsByKey(svcKey("ns", "web"))); !slices.Equal(got, []string{uid("ns", "b")}) {
		t.Errorf("endpoints = %v, want b only", got)
	}
	if got := uids(snap.WorkloadsOnNode("n1")); !slices.Equal(got, []string{uid("ns", "b")}) {
		t.Errorf("node n1 = %v", got)
	}
	// The old snapshot is immutable.
	if before.WorkloadByUID(uid("ns", "a")) == nil || len(before.EndpointsByKey(svcKey("ns", "web"))) != 2 ||
		before.ServiceByVIP("", ip("10.96.0.1"), "") == nil {
		t.Errorf("previous snapshot was modified")
	}
	// Removing unknown names changes nothing: no new generation.
	gen := s.Load().Generation
	if err := s.ApplyAddresses(nil, []string{"nope"}); err != nil || s.Load().Generation != gen {
		t.Errorf("no-op remove: err %v, generation %d → %d", err, gen, s.Load().Generation)
	}
}

func TestUpdateMovesIndexes(t *testing.T) {
	s := NewStore()
	mustApply(t, s, pod("ns", "a", "10.0.0.1", inService("ns/x", 80, 80), onNode("n1")))
	mustApply(t, s, pod("ns", "a", "10.0.0.2", inService("ns/y", 80, 80), onNode("n2")))
	snap := s.Load()
	if snap.WorkloadByIP("", ip("10.0.0.1")) != nil || snap.WorkloadByIP("", ip("10.0.0.2")) == nil {
		t.Errorf("IP index not moved")
	}
	if len(snap.EndpointsByKey("ns/x")) != 0 || len(snap.EndpointsByKey("ns/y")) != 1 {
		t.Errorf("endpoint index not moved")
	}
	if len(snap.WorkloadsOnNode("n1")) != 0 || len(snap.WorkloadsOnNode("n2")) != 1 {
		t.Errorf("node index not moved")
	}
	if snap.NumWorkloads() != 1 || snap.Generation != 2 {
		t.Errorf("count %d generation %d", snap.NumWorkloads(), snap.Generation)
	}
}

// TestRejected: a bad resource is rejected with its name and field, the good
// ones in the same call apply, and a rejected update keeps the previous
// version.
func TestRejected(t *testing.T) {
	badIP := func(w *workloadapi.Workload) { w.Addresses = append(w.Addresses, []byte{1, 2, 3}) }
	tests := []struct {
		name  string
		bad   *workloadapi.Address
		field string
		msg   string
	}{
		{"ip bytes", pod("ns", "bad", "10.0.0.9", badIP), "addresses[1]", "3 bytes"},
		{"legacy mTLS", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) {
			w.TunnelProtocol = workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS
		}), "tunnel_protocol", "LEGACY_ISTIO_MTLS"},
		{"unknown tunnel", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) { w.TunnelProtocol = 9 }), "tunnel_protocol", "unknown value 9"},
		{"no name", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) { w.Name = "" }), "name", "required"},
		{"no namespace", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) { w.Namespace = "" }), "namespace", "required"},
		{"bad trust domain", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) { w.TrustDomain = "Bad Domain" }), "trust_domain", ""},
		{"bad service account", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) { w.ServiceAccount = "a/b" }), "service_account", "SPIFFE"},
		{"status", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) { w.Status = 5 }), "status", "unknown"},
		{"network mode", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) { w.NetworkMode = 5 }), "network_mode", "unknown"},
		{"workload type", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) { w.WorkloadType = 9 }), "workload_type", "unknown"},
		{"service key", pod("ns", "bad", "10.0.0.9", inService("nohostname", 80, 80)), `services["nohostname"]`, "namespace/hostname"},
		{"target port", pod("ns", "bad", "10.0.0.9", inService("ns/h", 80, 70000)), `services["ns/h"].ports[0].target_port`, "out of range"},
		{"policy key", pod("ns", "bad", "10.0.0.9", policies("ok/x", "nope")), "authorization_policies[1]", "namespace/name"},
		{"waypoint empty", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) { w.Waypoint = &workloadapi.GatewayAddress{} }), "waypoint", "no destination"},
		{"gateway ip", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) {
			w.NetworkGateway = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{}}}
		}), "network_gateway.address.address", "0 bytes"},
		{"app tunnel", pod("ns", "bad", "10.0.0.9", func(w *workloadapi.Workload) {
			w.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: 3}
		}), "application_tunnel.protocol", "unknown"},
		{"service no hostname", svcOpts("ns", "bad", "", nil, func(s *workloadapi.Service) { s.Hostname = "" }), "hostname", "required"},
		{"service cidr", svcOpts("ns", "bad", "", nil, func(s *workloadapi.Service) {
			s.Addresses = []*workloadapi.NetworkAddress{{Address: []byte{10, 0, 0, 0}, Length: new(uint32(33))}}
		}), "addresses[0].length", "longer"},
		{"service vip bytes", svcOpts("ns", "bad", "", nil, func(s *workloadapi.Service) {
			s.Addresses = []*workloadapi.NetworkAddress{{Address: []byte{10}}}
		}), "addresses[0].address", "1 bytes"},
		{"service lb scope", svcOpts("ns", "bad", "10.96.0.9", nil, lb(workloadapi.LoadBalancing_STRICT, 0, workloadapi.LoadBalancing_UNSPECIFIED_SCOPE)),
			"load_balancing.routing_preference[0]", "unknown"},
		{"service lb mode", svcOpts("ns", "bad", "10.96.0.9", nil, lb(7, 0)), "load_balancing.mode", "unknown"},
		{"service app protocol", svcOpts("ns", "bad", "10.96.0.9", nil, func(s *workloadapi.Service) {
			s.Ports = []*workloadapi.Port{{ServicePort: 80, TargetPort: 80, AppProtocol: 42}}
		}), "ports[0].app_protocol", "unknown"},
		{"alias not a string", svcOpts("ns", "bad", "10.96.0.9", nil, func(s *workloadapi.Service) {
			s.Extensions = []*workloadapi.Extension{{Name: ExternalNameAliasExtension}}
		}), "extensions[0].config", "required"},
		{"empty address", &workloadapi.Address{}, "type", "neither"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore()
			// A previous good version of the same resource name.
			var resName string
			var prev *workloadapi.Address
			switch {
			case tt.bad.GetWorkload() != nil:
				resName, prev = uid("ns", "bad"), pod("ns", "bad", "10.0.0.8")
			case tt.bad.GetService() != nil:
				resName, prev = svcKey("ns", "bad"), svc("ns", "bad", "10.96.0.8")
			default:
				resName = "ns/empty"
			}
			if prev != nil {
				mustApply(t, s, prev)
			}
			good := pod("ns", "good", "10.0.0.10")
			err := s.ApplyAddresses(map[string]*workloadapi.Address{resName: tt.bad, name(good): good}, nil)
			var ae *ApplyError
			if !errors.As(err, &ae) || len(ae.Errors) != 1 {
				t.Fatalf("err = %v, want one rejected resource", err)
			}
			re := ae.Errors[0]
			if re.Resource != resName || re.Field != tt.field || !strings.Contains(re.Err.Error(), tt.msg) {
				t.Errorf("rejection = resource %q field %q err %q; want %q %q ~%q", re.Resource, re.Field, re.Err, resName, tt.field, tt.msg)
			}
			if want := "resource " + resName + ": field " + tt.field + ": "; !strings.Contains(err.Error(), want) {
				t.Errorf("message %q does not contain %q", err, want)
			}
			snap := s.Load()
			if snap.WorkloadByUID(uid("ns", "good")) == nil {
				t.Errorf("good resource of the same call not applied")
			}
			// Previous version kept.
			switch {
			case tt.bad.GetWorkload() != nil:
				if w := snap.WorkloadByUID(resName); w == nil || snap.WorkloadByIP("", ip("10.0.0.8")) != w {
					t.Errorf("previous workload version lost: %+v", w)
				}
			case tt.bad.GetService() != nil:
				if sv := snap.ServiceByHost(resName); sv == nil || snap.ServiceByVIP("", ip("10.96.0.8"), "") != sv {
					t.Errorf("previous service version lost: %+v", sv)
				}
			}
		})
	}
}

func TestRejectedNameMismatch(t *testing.T) {
	s := NewStore()
	p := pod("ns", "a", "10.0.0.1")
	err := s.ApplyAddresses(map[string]*workloadapi.Address{"wrong-name": p}, nil)
	var ae *ApplyError
	if !errors.As(err, &ae) || ae.Errors[0].Field != "uid" || ae.Errors[0].Resource != "wrong-name" {
		t.Fatalf("err = %v", err)
	}
	if s.Load().Generation != 0 {
		t.Errorf("nothing valid was applied, yet a snapshot was published")
	}
}

func TestApplyAuthorizations(t *testing.T) {
	s := NewStore()
	mustApply(t, s,
		pod("ns", "a", "10.0.0.1", policies("ns/sel", "ns/missing")),
		pod("other", "b", "10.0.0.2"),
	)
	err := s.ApplyAuthorizations(authzs(
		authz("ns", "ns-wide", securityapi.Scope_NAMESPACE, securityapi.Action_ALLOW),
		authz("istio-system", "global", securityapi.Scope_GLOBAL, securityapi.Action_DENY),
		authz("ns", "sel", securityapi.Scope_WORKLOAD_SELECTOR, securityapi.Action_ALLOW),
		authz("ns", "unselected", securityapi.Scope_WORKLOAD_SELECTOR, securityapi.Action_ALLOW),
		authz("other", "ns-wide", securityapi.Scope_NAMESPACE, securityapi.Action_ALLOW),
		&securityapi.Authorization{Name: "bad", Namespace: "ns", Action: 5},
	), nil)
	var ae *ApplyError
	if !errors.As(err, &ae) || len(ae.Errors) != 1 || ae.Errors[0].Resource != "ns/bad" || ae.Errors[0].Field != "action" {
		t.Fatalf("err = %v, want ns/bad field action", err)
	}
	if want := "resource ns/bad: field action: unknown value 5"; !strings.Contains(err.Error(), want) {
		t.Errorf("message %q lacks %q", err, want)
	}
	snap := s.Load()
	a := snap.WorkloadByUID(uid("ns", "a"))
	if got, want := snap.PolicyKeysFor(a), []string{"istio-system/global", "ns/ns-wide", "ns/sel"}; !slices.Equal(got, want) {
		t.Errorf("PolicyKeysFor(a) = %v, want %v", got, want)
	}
	b := snap.WorkloadByUID(uid("other", "b"))
	if got, want := snap.PolicyKeysFor(b), []string{"istio-system/global", "other/ns-wide"}; !slices.Equal(got, want) {
		t.Errorf("PolicyKeysFor(b) = %v, want %v", got, want)
	}
	// Remove and update: the per-snapshot cache must not leak across snapshots.
	if err := s.ApplyAuthorizations(authzs(authz("ns", "sel", securityapi.Scope_NAMESPACE, securityapi.Action_DENY)),
		[]string{"istio-system/global"}); err != nil {
		t.Fatal(err)
	}
	snap2 := s.Load()
	if got, want := snap2.PolicyKeysFor(a), []string{"ns/ns-wide", "ns/sel"}; !slices.Equal(got, want) {
		t.Errorf("after update PolicyKeysFor(a) = %v, want %v", got, want)
	}
	if got := snap2.PolicyKeysFor(b); !slices.Equal(got, []string{"other/ns-wide"}) {
		t.Errorf("after update PolicyKeysFor(b) = %v", got)
	}
	if got := snap.PolicyKeysFor(a); len(got) != 3 {
		t.Errorf("old snapshot changed: %v", got)
	}
	// Bad update keeps the previous version.
	if err := s.ApplyAuthorizations(authzs(&securityapi.Authorization{Name: "sel", Namespace: "ns", Scope: 9}), nil); err == nil {
		t.Fatal("want error")
	}
	if p := s.Load().Policy("ns/sel"); p == nil || p.Scope.String() != "NAMESPACE" {
		t.Errorf("previous policy version lost: %+v", p)
	}
	// Field paths from rbac conversion keep their depth.
	err = s.ApplyAuthorizations(authzs(authz("ns", "deep", 0, 0, &securityapi.Rule{Clauses: []*securityapi.Clause{{
		Matches: []*securityapi.Match{{DestinationPorts: []uint32{1 << 20}}}}}})), nil)
	if !errors.As(err, &ae) || ae.Errors[0].Field != "rules[0].clauses[0].matches[0].destination_ports[0]" {
		t.Errorf("err = %v", err)
	}
}

func TestPoliciesForNoAllocs(t *testing.T) {
	s := NewStore()
	mustApply(t, s, pod("ns", "a", "10.0.0.1", policies("ns/sel")))
	if err := s.ApplyAuthorizations(authzs(
		authz("ns", "x", securityapi.Scope_NAMESPACE, securityapi.Action_ALLOW),
		authz("ns", "sel", securityapi.Scope_WORKLOAD_SELECTOR, securityapi.Action_ALLOW)), nil); err != nil {
		t.Fatal(err)
	}
	snap := s.Load()
	w := snap.WorkloadByIP("", ip("10.0.0.1"))
	snap.PoliciesFor(w) // warm
	allocs := testing.AllocsPerRun(100, func() {
		if len(snap.PoliciesFor(w)) != 2 {
			t.Fatal("wrong policies")
		}
	})
	if allocs != 0 {
		t.Errorf("PoliciesFor allocates %v per call, want 0", allocs)
	}
}

func TestLookupsNoAllocs(t *testing.T) {
	s := NewStore()
	mustApply(t, s, pod("ns", "a", "10.0.0.1"), svc("ns", "web", "10.96.0.1", 80, 8080))
	snap := s.Load()
	wip, vip, u := ip("10.0.0.1"), ip("10.96.0.1"), uid("ns", "a")
	allocs := testing.AllocsPerRun(100, func() {
		if snap.WorkloadByIP("", wip) == nil || snap.ServiceByVIP("", vip, "ns") == nil ||
			snap.ServiceByNamespacedHostname("ns", "web.ns.svc.cluster.local") == nil || snap.WorkloadByUID(u) == nil {
			t.Fatal("lookup failed")
		}
	})
	if allocs != 0 {
		t.Errorf("lookups allocate %v per run, want 0", allocs)
	}
}

func TestWaitForAndChanged(t *testing.T) {
	s := NewStore()
	ch := s.Changed()
	select {
	case <-ch:
		t.Fatal("Changed closed before any swap")
	default:
	}
	// A waiter for a workload that arrives later.
	var wg sync.WaitGroup
	var got *Snapshot
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		got, werr = s.WaitFor(context.Background(), func(snap *Snapshot) bool {
			return snap.WorkloadByUID(uid("ns", "b")) != nil
		})
	}()
	mustApply(t, s, pod("ns", "a", "10.0.0.1"))
	<-ch // closed by the first swap
	if s.Changed() == ch {
		t.Error("Changed returned the closed channel after a swap")
	}
	mustApply(t, s, pod("ns", "b", "10.0.0.2"))
	wg.Wait()
	if werr != nil || got == nil || got.Generation != 2 {
		t.Fatalf("WaitFor = gen %v, %v", got, werr)
	}
	// Already true: returns at once.
	snap, err := s.WaitFor(context.Background(), func(*Snapshot) bool { return true })
	if err != nil || snap != s.Load() {
		t.Errorf("WaitFor(true) = %v, %v", snap, err)
	}
	// Bounded by ctx.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	snap, err = s.WaitFor(ctx, func(*Snapshot) bool { return false })
	if !errors.Is(err, context.Canceled) || snap != s.Load() {
		t.Errorf("WaitFor(cancelled) = %v, %v", snap, err)
	}
}

// TestConcurrentReaders runs readers against a writer (meaningful under -race).
func TestConcurrentReaders(t *testing.T) {
	s := NewStore()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.WaitFor(ctx, func(snap *Snapshot) bool {
				w := snap.WorkloadByIP("", ip("10.0.0.1"))
				if w != nil {
					snap.PoliciesFor(w)
				}
				return snap.Generation >= 50
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	for i := 0; i < 50; i++ {
		mustApply(t, s, pod("ns", "a", "10.0.0.1", capacity(uint32(i+2))))
	}
	wg.Wait()
}

// TestCopyOnWriteSharing: a one-resource update shares every untouched shard
// with the previous snapshot.
func TestCopyOnWriteSharing(t *testing.T) {
	s := NewStore()
	var as []*workloadapi.Address
	const n = parallelThreshold + 1000 // also exercises parallel conversion
	for i := 0; i < n; i++ {
		a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		as = append(as, pod("ns", "p"+a.String(), a.String(), inService("ns/web", 80, 80)))
	}
	mustApply(t, s, as...)
	before := s.Load()
	mustApply(t, s, pod("ns", "p10.1.0.7", "10.1.0.7", capacity(5), inService("ns/web", 80, 80)))
	after := s.Load()
	copied := 0
	for i := range before.workloads.shards {
		if !sameMap(before.workloads.shards[i], after.workloads.shards[i]) {
			copied++
		}
	}
	if copied != 1 {
		t.Errorf("%d uid shards copied for a one-workload update, want 1", copied)
	}
	if before.serviceVIP != after.serviceVIP || before.policies != after.policies {
		t.Errorf("untouched indexes were copied")
	}
	if after.WorkloadByIP("", ip("10.1.0.7")).Capacity != 5 || before.WorkloadByIP("", ip("10.1.0.7")).Capacity != 1 {
		t.Errorf("update not visible or leaked into the old snapshot")
	}
	// Strings converted by different workers are interned to one copy.
	var nsData, svcData *byte
	for w := range before.Workloads() {
		if nsData == nil {
			nsData, svcData = unsafeData(w.Namespace), unsafeData(w.Services[0].Service)
		}
		if unsafeData(w.Namespace) != nsData || unsafeData(w.Services[0].Service) != svcData {
			t.Fatalf("workload %s: strings not interned across conversion workers", w.UID)
		}
	}
	if len(after.EndpointsByKey("ns/web")) != n {
		t.Errorf("endpoints = %d", len(after.EndpointsByKey("ns/web")))
	}
}

func TestDump(t *testing.T) {
	s := NewStore()
	mustApply(t, s, pod("ns", "b", "10.0.0.2"), pod("ns", "a", "10.0.0.1"), svc("ns", "web", "10.96.0.1", 80, 8080))
	if err := s.ApplyAuthorizations(authzs(authz("ns", "p", securityapi.Scope_NAMESPACE, securityapi.Action_DENY)), nil); err != nil {
		t.Fatal(err)
	}
	d := s.Load().Dump()
	if d.Generation != 2 || len(d.Workloads) != 2 || d.Workloads[0].Name != "a" || len(d.Services) != 1 || len(d.Policies) != 1 {
		t.Fatalf("dump = %+v", d)
	}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"generation":2`, `"addresses":["10.0.0.1"]`, `"protocol":"HBONE"`, `"action":"DENY"`, `"prefix":"10.96.0.1/32"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("dump JSON lacks %s: %s", want, b)
		}
	}
}
