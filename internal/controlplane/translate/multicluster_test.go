package translate

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

func mcNamespace(name, rv string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-ns-" + name), ResourceVersion: rv, Labels: labels}}
}

func mcService(name, rv, ip string, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, UID: types.UID("uid-svc-" + name), ResourceVersion: rv, Labels: labels},
		Spec: corev1.ServiceSpec{ClusterIP: ip, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Port: 80}}},
	}
}

func mcEastWest(network, addr string) *gatewayv1.Gateway {
	term := gatewayv1.TLSModeTerminate
	ip := gatewayv1.IPAddressType
	return &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "eastwest", UID: "uid-gw", ResourceVersion: "1",
			Labels: map[string]string{LabelNetwork: network}},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: EastWestClass, Listeners: []gatewayv1.Listener{{
			Name: "mesh", Port: 15008, Protocol: "HBONE", TLS: &gatewayv1.ListenerTLSConfig{Mode: &term},
		}}},
		Status: gatewayv1.GatewayStatus{Addresses: []gatewayv1.GatewayStatusAddress{{Type: &ip, Value: addr}}},
	}
}

// twoClusters: cluster "east" (local, network n1) and "west" (remote,
// network n2), each with a global service "global" (one by its own label,
// one by its namespace's) and a local service "local", one pod behind
// each, and west's east-west gateway.
func twoClusters() (local, remote *cluster.Objects) {
	sys := func(net string) *corev1.Namespace {
		return mcNamespace("istio-system", "1", map[string]string{LabelNetwork: net})
	}
	local = &cluster.Objects{
		Namespaces: []*corev1.Namespace{mcNamespace("app", "1", nil), sys("n1")},
		Pods: []*corev1.Pod{
			localityPod("global-a", "", "10.1.0.1", map[string]string{"app": "global"}),
			localityPod("local-a", "", "10.1.0.2", map[string]string{"app": "local"}),
		},
		Services: []*corev1.Service{
			mcService("global", "1", "10.96.0.1", map[string]string{LabelGlobal: "true"}),
			mcService("local", "1", "10.96.0.2", nil),
		},
	}
	remote = &cluster.Objects{
		Namespaces: []*corev1.Namespace{mcNamespace("app", "1", map[string]string{LabelGlobal: "true"}), sys("n2")},
		Nodes:      []*corev1.Node{localityNode("w1", "1", map[string]string{LabelRegion: "eu", LabelZone: "eu-1"})},
		Pods: []*corev1.Pod{
			localityPod("global-b", "w1", "10.2.0.1", map[string]string{"app": "global"}),
			localityPod("local-b", "w1", "10.2.0.2", map[string]string{"app": "local"}),
			localityPod("remote-only-b", "w1", "10.2.0.3", map[string]string{"app": "remote-only"}),
		},
		Services: []*corev1.Service{
			mcService("global", "1", "10.97.0.1", nil),
			// Global in west (its namespace's label) but local in east.
			mcService("local", "1", "10.97.0.2", nil),
			mcService("remote-only", "1", "10.97.0.3", nil),
		},
		Gateways: []*gatewayv1.Gateway{mcEastWest("n2", "192.0.2.10")},
	}
	local.Sort()
	remote.Sort()
	return local, remote
}

func merge(cfg Config, local *cluster.Objects, remotes ...RemoteCluster) *Result {
	tr := NewTranslator(cfg)
	res, ch := tr.Update(local, nil)
	out, _ := NewMerger(cfg).Merge(res, ch, local, remotes)
	return out
}

func TestGlobalScopeExtensionNameMatchesNodeProxy(t *testing.T) {
	if GlobalScopeExtension != state.GlobalScopeExtension {
		t.Fatalf("translate %q != state %q", GlobalScopeExtension, state.GlobalScopeExtension)
	}
}

// TestMergeRemoteCluster: a global service gets the remote cluster's
// endpoints, with the remote cluster id in uid and cluster_id, the remote
// network, its Node's locality and the east-west gateway of that network;
// a local service and a remote-only one get none.
func TestMergeRemoteCluster(t *testing.T) {
	cfg := Config{ClusterID: "east", EnrollmentFromLabels: true}
	local, remote := twoClusters()
	res := merge(cfg, local, RemoteCluster{ID: "west", Objs: remote})

	svc, ok := res.Addresses.Get("app/global.app.svc.cluster.local")
	if !ok || !isGlobal(svc.GetService()) {
		t.Fatalf("service global = %v, want it with extension %s", svc, GlobalScopeExtension)
	}
	if l, _ := res.Addresses.Get("app/local.app.svc.cluster.local"); isGlobal(l.GetService()) {
		t.Fatal("service local carries the global-scope extension")
	}
	if _, ok := res.Addresses.Get("app/remote-only.app.svc.cluster.local"); ok {
		t.Fatal("a remote-only service was created locally")
	}
	a, ok := res.Addresses.Get("west//Pod/app/global-b")
	if !ok {
		t.Fatalf("no remote workload west//Pod/app/global-b; have %v", res.Addresses.Keys())
	}
	w := a.GetWorkload()
	want := &workloadapi.GatewayAddress{HboneMtlsPort: 15008, Destination: &workloadapi.GatewayAddress_Address{
		Address: netAddr("n2", netip.MustParseAddr("192.0.2.10"))}}
	switch {
	case w.Uid != "west//Pod/app/global-b" || w.ClusterId != "west" || w.Network != "n2":
		t.Fatalf("remote workload uid %q cluster %q network %q", w.Uid, w.ClusterId, w.Network)
	case !proto.Equal(w.NetworkGateway, want):
		t.Fatalf("network_gateway = %v, want %v", w.NetworkGateway, want)
	case w.Locality.GetRegion() != "eu" || w.Locality.GetZone() != "eu-1":
		t.Fatalf("locality = %v, want its west Node's eu/eu-1", w.Locality)
	case len(w.Services) != 1 || w.Services["app/global.app.svc.cluster.local"] == nil:
		t.Fatalf("services = %v, want only the global one", w.Services)
	}
	for _, k := range []string{"west//Pod/app/local-b", "west//Pod/app/remote-only-b"} {
		if _, ok := res.Addresses.Get(k); ok {
			t.Errorf("%s sent: it backs no service global in both clusters", k)
		}
	}
	l, ok := res.Addresses.Get("east//Pod/app/global-a")
	if !ok || l.GetWorkload().ClusterId != "east" || l.GetWorkload().Network != "n1" || l.GetWorkload().NetworkGateway != nil {
		t.Fatalf("local workload = %v, want cluster east, network n1 (its system namespace's), no gateway", l)
	}
	if len(res.Warnings) != 0 {
		t.Fatalf("warnings: %q", res.Warnings)
	}
}

// TestMergeNoGateway: without an east-west gateway for its network, a
// remote workload is sent without one (the node proxy refuses it) and a
// warning names the network.
func TestMergeNoGateway(t *testing.T) {
	cfg := Config{ClusterID: "east"}
	local, remote := twoClusters()
	remote.Gateways = nil
	res := merge(cfg, local, RemoteCluster{ID: "west", Objs: remote})
	a, ok := res.Addresses.Get("west//Pod/app/global-b")
	if !ok || a.GetWorkload().NetworkGateway != nil {
		t.Fatalf("remote workload = %v, want it without network_gateway", a)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], `workloads of network "n2" have no east-west gateway`) {
		t.Fatalf("warnings = %q, want one naming network n2", res.Warnings)
	}
	// Same network: no gateway needed, none set, no warning.
	remote.Namespaces = []*corev1.Namespace{mcNamespace("app", "1", map[string]string{LabelGlobal: "true"}),
		mcNamespace("istio-system", "2", map[string]string{LabelNetwork: "n1"})}
	res = merge(cfg, local, RemoteCluster{ID: "west", Objs: remote})
	if a, _ := res.Addresses.Get("west//Pod/app/global-b"); a.GetWorkload().GetNetwork() != "n1" || a.GetWorkload().NetworkGateway != nil || len(res.Warnings) != 0 {
		t.Fatalf("same network: workload %v, warnings %q", a, res.Warnings)
	}
}

// TestMergeTenantEastWestGatewayIgnored: a namespace owner's own
// istio-east-west Gateway, in this cluster or a remote one, labelled with
// a network and sorted before the real one, never becomes that network's
// gateway: it would receive every namespace's cross-network connections.
func TestMergeTenantEastWestGatewayIgnored(t *testing.T) {
	cfg := Config{ClusterID: "east"}
	local, remote := twoClusters()
	tenant := func(addr string) *gatewayv1.Gateway {
		g := mcEastWest("n2", addr)
		g.Namespace, g.Name = "aaa-tenant", "a-gateway"
		return g
	}
	local.Gateways = append(local.Gateways, tenant("198.51.100.66"))
	remote.Gateways = append([]*gatewayv1.Gateway{tenant("198.51.100.77")}, remote.Gateways...)
	local.Sort()
	remote.Sort()
	res := merge(cfg, local, RemoteCluster{ID: "west", Objs: remote})
	a, ok := res.Addresses.Get("west//Pod/app/global-b")
	if !ok {
		t.Fatal("remote workload missing")
	}
	got := a.GetWorkload().GetNetworkGateway().GetAddress().GetAddress()
	if want := []byte{192, 0, 2, 10}; string(got) != string(want) {
		t.Fatalf("network gateway %v, want the root namespace's 192.0.2.10", got)
	}
	if p := EastWestProblem(tenant("198.51.100.66"), DefaultRootNamespace); !strings.Contains(p, "root namespace") {
		t.Errorf("EastWestProblem of a tenant's Gateway = %q, want the root namespace named", p)
	}
	// With only the tenant's, the network has no gateway at all.
	remote.Gateways = []*gatewayv1.Gateway{tenant("198.51.100.77")}
	res = merge(cfg, local, RemoteCluster{ID: "west", Objs: remote})
	if a, _ := res.Addresses.Get("west//Pod/app/global-b"); a.GetWorkload().GetNetworkGateway() != nil {
		t.Fatalf("only a tenant's gateway: network gateway %v, want none", a.GetWorkload().GetNetworkGateway())
	}
}

// TestMergeServiceScopeConfigs: meshConfig.serviceScopeConfigs makes a
// service global by selector, as the label does.
func TestMergeServiceScopeConfigs(t *testing.T) {
	local, remote := twoClusters()
	cfg := Config{ClusterID: "east", ServiceScopeConfigs: []*meshv1alpha1.MeshConfig_ServiceScopeConfigs{{
		ServicesSelector: &meshv1alpha1.LabelSelector{MatchExpressions: []*meshv1alpha1.LabelSelectorRequirement{
			{Key: "scope", Operator: "In", Values: []string{"wide"}}}},
		Scope: meshv1alpha1.MeshConfig_ServiceScopeConfigs_GLOBAL,
	}}}
	if err := ValidateServiceScopeConfigs(cfg.ServiceScopeConfigs); err != nil {
		t.Fatal(err)
	}
	res := merge(cfg, local, RemoteCluster{ID: "west", Objs: remote})
	if _, ok := res.Addresses.Get("west//Pod/app/local-b"); ok {
		t.Fatal("service local got a remote endpoint before a scope config selected it")
	}
	local.Services[1] = mcService("local", "2", "10.96.0.2", map[string]string{"scope": "wide"})
	res = merge(cfg, local, RemoteCluster{ID: "west", Objs: remote})
	if _, ok := res.Addresses.Get("west//Pod/app/local-b"); !ok {
		t.Fatal("service local selected GLOBAL by serviceScopeConfigs got no remote endpoint")
	}
	bad := []*meshv1alpha1.MeshConfig_ServiceScopeConfigs{{NamespaceSelector: &meshv1alpha1.LabelSelector{
		MatchExpressions: []*meshv1alpha1.LabelSelectorRequirement{{Key: "k", Operator: "Matches"}}}}}
	if err := ValidateServiceScopeConfigs(bad); err == nil || !strings.Contains(err.Error(), "serviceScopeConfigs[0].namespaceSelector.matchExpressions[0]") {
		t.Fatalf("bad operator: %v", err)
	}
}

// TestMergeIncremental: after each change, the incremental Merger (and the
// Translators under it) gives what a fresh one gives, and a remote pod
// change pushes only that workload.
func TestMergeIncremental(t *testing.T) {
	cfg := Config{ClusterID: "east"}
	local, remote := twoClusters()
	// A local warning, for the merged warnings to be kept beside.
	local.Services[1].Annotations = map[string]string{AnnotationTrafficDist: "Nowhere"}
	tr, m := NewTranslator(cfg), NewMerger(cfg)
	step := func(name string, local *cluster.Objects, remotes ...RemoteCluster) *Changes {
		t.Helper()
		res, ch := tr.Update(local, nil)
		got, mch := m.Merge(res, ch, local, remotes)
		want := merge(cfg, local, remotes...)
		if g, w := got.Addresses.Keys(), want.Addresses.Keys(); strings.Join(g, ",") != strings.Join(w, ",") {
			t.Fatalf("%s: keys %v, want %v", name, g, w)
		}
		for k, a := range want.Addresses.All() {
			if b, _ := got.Addresses.Get(k); !proto.Equal(a, b) {
				t.Fatalf("%s: %s = %v, want %v", name, k, b, a)
			}
		}
		if !slices.Equal(got.Warnings, want.Warnings) {
			t.Fatalf("%s: warnings %q, want %q", name, got.Warnings, want.Warnings)
		}
		return mch
	}
	step("first", local, RemoteCluster{ID: "west", Objs: remote})

	// A remote pod appears: one workload pushed.
	r2 := *remote
	r2.Pods = append(append([]*corev1.Pod(nil), remote.Pods...), localityPod("global-c", "w1", "10.2.0.9", map[string]string{"app": "global"}))
	r2.Sort()
	ch := step("remote pod added", local, RemoteCluster{ID: "west", Objs: &r2})
	if ch.Full || len(ch.Addresses) != 1 || ch.Addresses["west//Pod/app/global-c"] == nil || len(ch.Removed) != 0 {
		t.Fatalf("remote pod added: changes full=%v %v removed %v", ch.Full, addrKeys(ch.Addresses), ch.Removed)
	}
	// The local service turns local: the remote endpoints go.
	l2 := *local
	l2.Services = []*corev1.Service{mcService("global", "2", "10.96.0.1", nil), local.Services[1]}
	ch = step("local service made local", &l2, RemoteCluster{ID: "west", Objs: &r2})
	if len(ch.Removed) != 2 {
		t.Fatalf("service made local: removed %v, want the two remote workloads", ch.Removed)
	}
	step("made global again", local, RemoteCluster{ID: "west", Objs: &r2})
	// A local Namespace change (re-translating that namespace only) leaves
	// the remote workloads as the very same resources.
	before, _ := m.out.Get("west//Pod/app/global-b")
	l3 := *local
	l3.Namespaces = []*corev1.Namespace{mcNamespace("app", "2", map[string]string{"team": "a"}), local.Namespaces[1]}
	ch = step("local namespace change", &l3, RemoteCluster{ID: "west", Objs: &r2})
	if after, _ := m.out.Get("west//Pod/app/global-b"); after != before {
		t.Fatalf("local namespace change: full=%v, remote workload re-made (%p → %p)", ch.Full, before, after)
	}
	step("namespace back", local, RemoteCluster{ID: "west", Objs: &r2})
	// The gateway goes: workloads stay, without it.
	r3 := r2
	r3.Gateways = nil
	if len(m.warnings) != 0 {
		t.Fatalf("warnings with the gateway: %q", m.warnings)
	}
	step("gateway removed", local, RemoteCluster{ID: "west", Objs: &r3})
	if len(m.warnings) != 1 {
		t.Fatalf("gateway removed: warnings %q", m.warnings)
	}
	// The gateway comes back, then goes again: the warning follows.
	step("gateway back", local, RemoteCluster{ID: "west", Objs: &r2})
	step("gateway removed again", local, RemoteCluster{ID: "west", Objs: &r3})
	// West moves onto east's network with a pod at the address of east's
	// global-a: that one is withheld (with a warning), and sent once
	// east's pod moves away, incrementally.
	same := *remote
	same.Namespaces = []*corev1.Namespace{mcNamespace("app", "1", map[string]string{LabelGlobal: "true"}),
		mcNamespace("istio-system", "2", map[string]string{LabelNetwork: "n1"})}
	same.Pods = []*corev1.Pod{localityPod("global-b", "w1", "10.1.0.1", map[string]string{"app": "global"}), remote.Pods[1], remote.Pods[2]}
	same.Sort()
	step("same network, overlapping address", local, RemoteCluster{ID: "west", Objs: &same})
	if _, ok := m.out.Get("west//Pod/app/global-b"); ok || len(m.warnings) != 1 || !strings.Contains(m.warnings[0], "pod CIDRs overlap") {
		t.Fatalf("overlapping address: sent=%v warnings %q", ok, m.warnings)
	}
	moved := *local
	moved.Pods = []*corev1.Pod{localityPod("global-a", "", "10.1.0.9", map[string]string{"app": "global"}), local.Pods[1]}
	moved.Pods[0].ResourceVersion = "2"
	ch = step("east's pod moved away", &moved, RemoteCluster{ID: "west", Objs: &same})
	if ch.Full || ch.Addresses["west//Pod/app/global-b"] == nil || len(m.warnings) != 0 {
		t.Fatalf("east's pod moved: full=%v changed %v warnings %q", ch.Full, addrKeys(ch.Addresses), m.warnings)
	}
	step("east's pod back", local, RemoteCluster{ID: "west", Objs: &same})
	if _, ok := m.out.Get("west//Pod/app/global-b"); ok {
		t.Fatal("overlapping address sent after east's pod came back")
	}
	// The remote cluster goes: its workloads go (and with them its
	// gateway's), the local ones stay.
	step("remote back", local, RemoteCluster{ID: "west", Objs: &r2})
	ch = step("remote dropped", local)
	want := []string{"west//Gateway/istio-system/eastwest", "west//Pod/app/global-b", "west//Pod/app/global-c"}
	if !slices.Equal(ch.Removed, want) {
		t.Fatalf("remote dropped: removed %v, want %v", ch.Removed, want)
	}
}

func addrKeys(m map[string]*workloadapi.Address) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestMergeGatewayWorkload: another network's east-west gateway, known by
// IP, is sent as a workload on that network at that IP with the Gateway's
// identity (node proxies resolve network_gateway to it, as Istio's
// fetch_network_gateway does); it goes when the Gateway goes, and a
// gateway of this cluster's own network is not sent.
func TestMergeGatewayWorkload(t *testing.T) {
	cfg := Config{ClusterID: "east"}
	local, remote := twoClusters()
	tr := NewTranslator(cfg)
	lres, lch := tr.Update(local, nil)
	m := NewMerger(cfg)
	res, _ := m.Merge(lres, lch, local, []RemoteCluster{{ID: "west", Objs: remote}})
	const uid = "west//Gateway/istio-system/eastwest"
	a, ok := res.Addresses.Get(uid)
	if !ok {
		t.Fatalf("no gateway workload %s; have %v", uid, res.Addresses.Keys())
	}
	w := a.GetWorkload()
	ip, _ := netip.AddrFromSlice(w.GetAddresses()[0])
	switch {
	case w.Network != "n2" || len(w.Addresses) != 1 || ip != netip.MustParseAddr("192.0.2.10"):
		t.Fatalf("gateway workload network %q addresses %v, want n2 192.0.2.10", w.Network, w.Addresses)
	case w.Namespace != "istio-system" || w.ServiceAccount != "eastwest" || w.ClusterId != "west":
		t.Fatalf("gateway workload identity ns %q sa %q cluster %q", w.Namespace, w.ServiceAccount, w.ClusterId)
	case w.TunnelProtocol != workloadapi.TunnelProtocol_HBONE || w.NetworkGateway != nil || len(w.Services) != 0:
		t.Fatalf("gateway workload = %v", w)
	}

	// The remote's Gateway goes: so does its workload (an incremental merge).
	gone := *remote
	gone.Gateways = nil
	lres, lch = tr.Update(local, nil)
	res, ch := m.Merge(lres, lch, local, []RemoteCluster{{ID: "west", Objs: &gone}})
	if _, ok := res.Addresses.Get(uid); ok {
		t.Fatal("gateway workload kept after its Gateway went")
	}
	if !ch.Full && !slices.Contains(ch.Removed, uid) {
		t.Fatalf("changes do not remove %s: %v", uid, ch.Removed)
	}

	// Same network as this cluster: no gateway is crossed, none is sent.
	remote.Namespaces = []*corev1.Namespace{mcNamespace("app", "1", map[string]string{LabelGlobal: "true"}),
		mcNamespace("istio-system", "2", map[string]string{LabelNetwork: "n1"})}
	remote.Gateways = []*gatewayv1.Gateway{mcEastWest("n1", "192.0.2.10")}
	res = merge(cfg, local, RemoteCluster{ID: "west", Objs: remote})
	if _, ok := res.Addresses.Get(uid); ok {
		t.Fatal("a gateway of this cluster's own network was sent as a workload")
	}
}
