package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

// Issue 24's attacks, each with a victim namespace and an attacker
// namespace that only creates namespace-scoped objects (ServiceEntries, a
// waypoint Gateway and its pod), in the mesh meshlab builds from the real
// binaries.

// tenantMesh starts a two-node mesh with the given ambient namespaces.
func tenantMesh(t *testing.T, namespaces ...string) *meshlab.Mesh {
	t.Helper()
	roottest.Require(t)
	m, err := meshlab.Start(t, meshlab.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range namespaces {
		if err := m.AddNamespace(ns, ambientNS); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// echoPod adds a pod on node that echoes on 9000.
func echoPod(t *testing.T, ctx context.Context, m *meshlab.Mesh, node int, ns, name string) *testcluster.Pod {
	t.Helper()
	p, err := m.AddPod(ctx, node, testcluster.PodSpec{Name: name, Namespace: ns, ServiceAccount: name,
		Labels:     map[string]string{"app": name},
		Containers: []kube.Container{{Name: "app", Ports: []kube.ContainerPort{{Name: "tcp-echo", Port: 9000}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// echoService adds Service ns/name (80 → 9000) selecting app=app.
func echoService(t *testing.T, m *meshlab.Mesh, ns, name, app string) netip.Addr {
	t.Helper()
	if _, err := m.AddService(testcluster.ServiceSpec{Name: name, Namespace: ns, Selector: map[string]string{"app": app},
		Ports: []kube.ServicePort{{Name: "tcp-echo", Port: 80, TargetPort: 9000}}}); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncKubeProxy(); err != nil {
		t.Fatal(err)
	}
	return m.Service(ns, name)
}

// waitDump waits until node's proxy config dump contains (or, with
// present false, lacks) s.
func waitDump(t *testing.T, ctx context.Context, m *meshlab.Mesh, node int, s string, present bool) {
	t.Helper()
	ns, host, _ := strings.Cut(s, "/")
	for {
		d, err := m.ConfigDump(ctx, node)
		if err == nil && dumpHasService(d, ns, host) == present {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("node%d config dump: service %q present=%v never held (last error %v)", node, s, present, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// dumpHasService reports whether a node proxy's config dump (Istio
// ztunnel's shape) lists the service ns/host.
func dumpHasService(dump []byte, ns, host string) bool {
	var d struct {
		Services []struct{ Namespace, Hostname string } `json:"services"`
	}
	if json.Unmarshal(dump, &d) != nil {
		return false
	}
	for _, s := range d.Services {
		if s.Namespace == ns && s.Hostname == host {
			return true
		}
	}
	return false
}

// cpStatus waits (up to 20 s) until the control plane's config dump
// contains s (the object's status), else records an error.
func cpStatus(t *testing.T, m *meshlab.Mesh, s string) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	var last []byte
	for {
		code, body, err := m.NodeHTTP(ctx, 0, "http://"+meshlab.CPAdminAddr+"/config_dump")
		if err == nil && code == 200 {
			if bytes.Contains(body, []byte(s)) {
				return
			}
			last = body
		}
		select {
		case <-ctx.Done():
			t.Errorf("control plane config dump never said %q; last: %s", s, last)
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// echoes dials dst from p and checks the payload comes back.
func echoes(t *testing.T, ctx context.Context, p *testcluster.Pod, dst netip.AddrPort) {
	t.Helper()
	want := payload(4096)
	got, err := meshlab.RoundTrip(ctx, p, dst, want)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s/%s to %s: got %d of %d bytes (%v)", p.Namespace, p.Name, dst, len(got), len(want), err)
	}
}

// TestTenantServiceEntryCIDR: namespace evil creates a ServiceEntry
// 0.0.0.0/0 (plus a range of its own, 203.0.113.0/24) with resolution NONE,
// bound to its own waypoint evil/wp. Before and after the waypoint runs,
// the victim's pod-to-pod traffic by IP (across nodes and inside one),
// same-namespace Service traffic and egress to an address nobody owns are
// untouched and never reach evil's waypoint: its access log has no line
// from the victim and a capture of the underlay shows no packet between
// the victim's pods and the waypoint. The control plane says why the /0 is
// refused; evil's own range still works (its client's connection reaches
// the waypoint), so the silence is not a dead waypoint.
func TestTenantServiceEntryCIDR(t *testing.T) {
	m := tenantMesh(t, "victim", "evil")
	ctx := ctxT(t, 3*time.Minute)
	client := echoPod(t, ctx, m, 0, "victim", "client")
	peer := echoPod(t, ctx, m, 0, "victim", "peer")
	server := echoPod(t, ctx, m, 1, "victim", "server")
	vip := echoService(t, m, "victim", "web", "server")
	evilClient := echoPod(t, ctx, m, 0, "evil", "client")
	wpYAML := filepath.Join(t.TempDir(), "evil-wp.yaml")
	if err := os.WriteFile(wpYAML, []byte(`apiVersion: v1
kind: Pod
metadata:
  name: wp
  namespace: evil
  labels: {gateway.networking.k8s.io/gateway-name: wp, istio.io/dataplane-mode: none}
spec:
  nodeName: node1
  serviceAccountName: wp
  containers: [{name: istio-proxy, image: istio/proxyv2}]
---
apiVersion: v1
kind: Service
metadata: {name: wp, namespace: evil}
spec:
  selector: {gateway.networking.k8s.io/gateway-name: wp}
  ports: [{name: mesh, port: 15008, targetPort: 15008}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: wp, namespace: evil}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.LoadYAML(ctx, wpYAML); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, client.IP, peer.IP, server.IP, evilClient.IP); err != nil {
		t.Fatal(err)
	}
	wpPod := m.Pod("evil", "wp")
	apply(t, m, "evil-all", `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: all
  namespace: evil
  labels: {istio.io/use-waypoint: wp}
spec:
  hosts: [all.evil]
  addresses: ["0.0.0.0/0", "203.0.113.0/24"]
  ports: [{number: 9000, name: tcp, protocol: TCP}]
  location: MESH_EXTERNAL
  resolution: NONE
`)
	for _, n := range []int{0, 1} {
		waitDump(t, ctx, m, n, "evil/all.evil", true)
	}

	victimTraffic := func(t *testing.T) {
		t.Helper()
		tctx := ctxT(t, 30*time.Second)
		echoes(t, tctx, client, netip.AddrPortFrom(server.IP, 9000)) // pod to pod, across nodes
		echoes(t, tctx, client, netip.AddrPortFrom(peer.IP, 9000))   // same namespace, same node
		echoes(t, tctx, peer, netip.AddrPortFrom(server.IP, 9000))
		echoes(t, tctx, client, netip.AddrPortFrom(vip, 80)) // the victim's Service
		// Egress to an address nobody in the mesh owns (and nothing
		// answers): it leaves as it was dialled.
		ectx, cancel := context.WithTimeout(tctx, 3*time.Second)
		_, _ = meshlab.RoundTrip(ectx, client, netip.MustParseAddrPort("198.51.100.10:9000"), []byte("egress"))
		cancel()
	}

	// Before the waypoint runs: nothing of the victim's breaks.
	t.Run("no waypoint yet", victimTraffic)

	wp, err := m.StartWaypoint(ctx, "evil", "wp")
	if err != nil {
		t.Fatal(err)
	}
	// evil's own range is live: its client reaches the waypoint.
	_, _ = meshlab.RoundTrip(ctxT(t, 5*time.Second), evilClient, netip.MustParseAddrPort("203.0.113.10:9000"), []byte("mine"))
	if _, err := wp.WaitAccessLog(ctxT(t, 20*time.Second), func(a meshlab.AccessLog) bool {
		return strings.Contains(a.Str("src.identity"), "/ns/evil/")
	}); err != nil {
		t.Fatalf("evil's own range never reached its waypoint, so the test proves nothing: %v", err)
	}

	capture, err := m.CaptureUnderlay(ctxT(t, 10*time.Second), fmt.Sprintf("tcp and host %s and port 15008", wpPod.IP))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("waypoint running", victimTraffic)
	pkts, err := capture.Stop()
	if err != nil {
		t.Fatal(err)
	}
	victims := map[netip.Addr]bool{client.IP: true, peer.IP: true, server.IP: true}
	for _, p := range pkts {
		if victims[p.Src.Addr()] || victims[p.Dst.Addr()] {
			t.Errorf("victim traffic on the wire to or from evil's waypoint: %s → %s", p.Src, p.Dst)
		}
	}
	for _, a := range wp.AccessLogs() {
		if strings.Contains(a.Str("src.identity"), "/ns/victim/") || victims[netip.MustParseAddrPort(orZero(a.Str("src.addr"))).Addr()] {
			t.Errorf("evil's waypoint saw victim traffic: %v", a)
		}
	}
	for _, n := range []int{0, 1} {
		for _, a := range m.AccessLogs(n) {
			if a.Str("src.workload") != "" && a.Str("dst.service") == "all.evil" && !strings.Contains(a.Str("src.identity"), "/ns/evil/") {
				t.Errorf("node%d routed a victim connection as evil's ServiceEntry: %v", n, a)
			}
		}
	}
	cpStatus(t, m, "spec.addresses[0]: 0.0.0.0/0 covers every address")
}

func orZero(addrPort string) string {
	if _, err := netip.ParseAddrPort(addrPort); err != nil {
		return "0.0.0.0:0"
	}
	return addrPort
}

// TestTenantClusterIPClaim: namespace aaa (sorting before everyone)
// creates an older ServiceEntry that lists the victim's ClusterIP with a
// STATIC endpoint of its own. The victim's Service keeps the address for
// every client namespace (victim, a third one, aaa itself): each
// connection is routed as the victim's Service to the victim's pod, and
// the control plane's status of aaa's ServiceEntry says the address is
// refused as the victim's.
func TestTenantClusterIPClaim(t *testing.T) {
	m := tenantMesh(t, "victim", "third", "aaa")
	ctx := ctxT(t, 3*time.Minute)
	server := echoPod(t, ctx, m, 1, "victim", "server")
	vip := echoService(t, m, "victim", "web", "server")
	sink := echoPod(t, ctx, m, 1, "aaa", "sink")
	clients := []*testcluster.Pod{
		echoPod(t, ctx, m, 0, "victim", "client"),
		echoPod(t, ctx, m, 0, "third", "client"),
		echoPod(t, ctx, m, 0, "aaa", "client"),
	}
	if err := m.WaitForWorkloads(ctx, server.IP, sink.IP, clients[0].IP, clients[1].IP, clients[2].IP); err != nil {
		t.Fatal(err)
	}
	apply(t, m, "aaa-steal", fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: steal, namespace: aaa, creationTimestamp: "2020-01-01T00:00:00Z"}
spec:
  hosts: [steal.aaa.example]
  addresses: [%q, "192.0.2.77"]
  ports: [{number: 80, name: tcp, protocol: TCP, targetPort: 9000}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{address: %q}]
`, vip, sink.IP))
	waitDump(t, ctx, m, 0, "aaa/steal.aaa.example", true)
	for _, c := range clients {
		t.Run(c.Namespace, func(t *testing.T) {
			tctx := ctxT(t, 20*time.Second)
			echoes(t, tctx, c, netip.AddrPortFrom(vip, 80))
			if _, err := m.WaitAccessLog(tctx, 0, meshlab.Fields(map[string]string{
				"direction": "outbound", "src.workload": "client", "src.namespace": c.Namespace,
				"dst.service": "web.victim.svc.cluster.local", "dst.workload": "server",
			})); err != nil {
				t.Errorf("%s/client to %s: not routed as victim/web to its pod: %v", c.Namespace, vip, err)
			}
			for _, a := range m.AccessLogs(0) {
				if a.Str("src.namespace") == c.Namespace && a.Str("dst.service") == "steal.aaa.example" {
					t.Errorf("%s/client routed as aaa's ServiceEntry: %v", c.Namespace, a)
				}
			}
		})
	}
	// The rest of aaa's entry still applies (its own clients reach its sink).
	echoes(t, ctxT(t, 20*time.Second), clients[2], netip.MustParseAddrPort("192.0.2.77:80"))
	cpStatus(t, m, fmt.Sprintf("spec.addresses[0]: %s is the address of Service victim/web", vip))
}

// TestTenantExportTo: a ServiceEntry with exportTo ["."] in namespace
// owner is resolved (by the node proxy's DNS) and routed as that service
// for owner's clients only; a client of namespace other gets the cluster
// DNS server's NXDOMAIN and its connection to the address is not routed
// as the service.
func TestTenantExportTo(t *testing.T) {
	m := tenantMesh(t, "owner", "other")
	ctx := ctxT(t, 3*time.Minute)
	server := echoPod(t, ctx, m, 1, "owner", "server")
	mine := echoPod(t, ctx, m, 0, "owner", "client")
	theirs := echoPod(t, ctx, m, 0, "other", "client")
	if err := m.WaitForWorkloads(ctx, server.IP, mine.IP, theirs.IP); err != nil {
		t.Fatal(err)
	}
	const host, addr = "private.owner.example", "240.241.0.10"
	apply(t, m, "owner-private", fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: private, namespace: owner}
spec:
  hosts: [%s]
  addresses: [%s]
  exportTo: ["."]
  ports: [{number: 80, name: tcp, protocol: TCP, targetPort: 9000}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{address: %q}]
`, host, addr, server.IP))
	waitDump(t, ctx, m, 0, "owner/"+host, true)
	clusterDNS := netip.AddrPortFrom(m.DNSPod.IP, 53)
	dst := netip.AddrPortFrom(netip.MustParseAddr(addr), 80)

	t.Run("own namespace", func(t *testing.T) {
		tctx := ctxT(t, 20*time.Second)
		r, err := meshlab.DNSQuery(tctx, mine, "udp", clusterDNS, host, dns.TypeA)
		if err != nil {
			t.Fatal(err)
		}
		if ip, err := meshlab.FirstA(r); err != nil || ip != dst.Addr() {
			t.Errorf("owner/client: %s = %v (%v), want %s from its node proxy", host, ip, err, addr)
		}
		echoes(t, tctx, mine, dst)
		if _, err := m.WaitAccessLog(tctx, 0, meshlab.Fields(map[string]string{
			"direction": "outbound", "src.namespace": "owner", "dst.service": host,
			"dst.addr": netip.AddrPortFrom(server.IP, 9000).String(), // the entry's endpoint: the owner's pod
		})); err != nil {
			t.Error(err)
		}
	})
	t.Run("other namespace", func(t *testing.T) {
		tctx := ctxT(t, 20*time.Second)
		r, err := meshlab.DNSQuery(tctx, theirs, "udp", clusterDNS, host, dns.TypeA)
		if err != nil {
			t.Fatal(err)
		}
		if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
			t.Errorf("other/client: %s answered %s %v, want the cluster DNS server's NXDOMAIN", host, dns.RcodeToString[r.Rcode], r.Answer)
		}
		ectx, cancel := context.WithTimeout(tctx, 3*time.Second)
		got, _ := meshlab.RoundTrip(ectx, theirs, dst, []byte("hello"))
		cancel()
		if len(got) > 0 {
			t.Errorf("other/client reached %s through the mesh: %q", dst, got)
		}
		time.Sleep(500 * time.Millisecond) // the access-log line of that connection
		for _, a := range m.AccessLogs(0) {
			if a.Str("src.namespace") == "other" && a.Str("dst.service") == host {
				t.Errorf("other/client routed as owner's private ServiceEntry: %v", a)
			}
		}
	})
}
