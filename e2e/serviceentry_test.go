package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// seEnv is a meshEnv whose node-proxy state comes from the control plane's
// translation of real objects: the captured client pod apps/client on
// node 0 and the ServiceEntries a test gives. The servers it dials are
// uncaptured pods on node 1 the mesh knows only through those entries.
type seEnv struct {
	*meshEnv
	client *meshPod
}

func newSEEnv(t *testing.T) *seEnv {
	m := newMeshEnv(t)
	return &seEnv{meshEnv: m, client: m.addPod(m.c.Node(0), "client", "client", true)}
}

// apply translates the client pod and ses as the control plane does and
// hands the addresses to the node proxy's store.
func (e *seEnv) apply(ses ...*networkingv1.ServiceEntry) *translate.Result {
	t := e.t
	t.Helper()
	c := e.client
	objs := &cluster.Objects{
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "apps",
			Labels: map[string]string{"istio.io/dataplane-mode": "ambient"}}}},
		Pods: []*corev1.Pod{{
			ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: "pod-client",
				Labels: map[string]string{"app": "client", "version": "v1"}},
			Spec: corev1.PodSpec{NodeName: c.Node.Name, ServiceAccountName: c.ServiceAccount},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: c.IP.String(),
				PodIPs:     []corev1.PodIP{{IP: c.IP.String()}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}},
		ServiceEntries: ses,
	}
	objs.Sort()
	res := translate.Translate(translate.LocalDefaults(), objs, nil)
	adds := map[string]*workloadapi.Address{}
	for k, a := range res.Addresses.All() {
		adds[k] = a
	}
	if err := e.store.ApplyAddresses(adds, nil); err != nil {
		t.Fatalf("node proxy refuses the translation: %v", err)
	}
	if len(res.Warnings) > 0 {
		t.Logf("translation warnings: %v", res.Warnings)
	}
	return res
}

func serviceEntry(name string, created int64, host string, res networkingv1alpha3.ServiceEntry_Resolution, port uint32, addrs ...string) *networkingv1.ServiceEntry {
	return &networkingv1.ServiceEntry{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "egress", CreationTimestamp: metav1.NewTime(time.Unix(created, 0))},
		Spec: networkingv1alpha3.ServiceEntry{
			Hosts: []string{host}, Addresses: addrs, Resolution: res, Location: networkingv1alpha3.ServiceEntry_MESH_EXTERNAL,
			Ports: []*networkingv1alpha3.ServicePort{{Number: port, Name: "tcp", Protocol: "TCP"}},
		},
	}
}

// expectConn dials dst from the client and checks the answer (the
// server's view of the client address: 8081 answers with it) and that the
// connection was reported as destination_service host, reaching dstAddr.
func (e *seEnv) expectConn(dst netip.AddrPort, host string, dstAddr netip.AddrPort) {
	t := e.t
	t.Helper()
	before := e.metric("istio_tcp_connections_opened_total", map[string]string{"reporter": "source", "destination_service": host})
	got, err := roundTrip(t, e.client.Pod, dst, nil)
	if err != nil || strings.TrimSpace(string(got)) != e.client.IP.String() {
		t.Errorf("connection to %s: %q (%v), want the server to see the pod's own address %s", dst, got, err, e.client.IP)
		return
	}
	labels := map[string]string{"reporter": "source", "destination_service": host, "source_workload": "client",
		"destination_service_namespace": "egress", "response_flags": "-"}
	deadline := time.Now().Add(5 * time.Second)
	for e.metric("istio_tcp_connections_closed_total", labels) < before+1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := e.metric("istio_tcp_connections_opened_total", labels); got != before+1 {
		t.Errorf("connection to %s: istio_tcp_connections_opened_total%v = %v, want %v (routed as that ServiceEntry)", dst, labels, got, before+1)
	}
	if n := len(e.accessLines(map[string]string{"dst.service": host, "dst.addr": dstAddr.String()})); n == 0 {
		t.Errorf("connection to %s: no access-log line with dst.service %s and dst.addr %s", dst, host, dstAddr)
	}
}

// TestServiceEntryCIDR: ServiceEntries whose addresses are CIDRs (Istio
// 1.30) route a pod's connections to any IP inside them as that
// ServiceEntry: the longest prefix wins, an exact address beats every
// prefix, and a STATIC one load-balances an address nobody listens on to
// its endpoint. The servers are uncaptured pods on node 1 (10.31.1.0/24).
func TestServiceEntryCIDR(t *testing.T) {
	e := newSEEnv(t)
	n1 := e.c.Node(1)
	a := e.addPod(n1, "ext-a", "ext", false)
	b := e.addPod(n1, "ext-b", "ext", false)
	c := e.addPod(n1, "ext-c", "ext", false)
	wide := n1.PodCIDR
	narrow := netip.PrefixFrom(c.IP, 30).Masked()
	if !wide.Contains(a.IP) || !wide.Contains(b.IP) || !narrow.Contains(c.IP) || narrow.Contains(a.IP) || narrow.Contains(b.IP) {
		t.Fatalf("pod addresses %s %s %s do not fit %s and %s", a.IP, b.IP, c.IP, wide, narrow)
	}
	virtual := netip.MustParsePrefix("10.77.0.0/16") // nothing listens here
	static := serviceEntry("virtual", 4, "virtual.ext", networkingv1alpha3.ServiceEntry_STATIC, 9000, virtual.String())
	// The endpoint is b, which exact.ext names anyway: an endpoint is a
	// workload, and a range never takes a workload's address, so an
	// endpoint at a would keep wide.ext from capturing a.
	static.Spec.Endpoints = []*networkingv1alpha3.WorkloadEntry{{Address: b.IP.String(), Ports: map[string]uint32{"tcp": 8081}}}
	res := e.apply(
		serviceEntry("wide", 1, "wide.ext", networkingv1alpha3.ServiceEntry_NONE, 8081, wide.String()),
		serviceEntry("narrow", 2, "narrow.ext", networkingv1alpha3.ServiceEntry_NONE, 8081, narrow.String()),
		serviceEntry("exact", 3, "exact.ext", networkingv1alpha3.ServiceEntry_NONE, 8081, b.IP.String()),
		static,
	)
	if s, _ := res.Addresses.Get("egress/wide.ext"); s.GetService().GetAddresses()[0].GetLength() != uint32(wide.Bits()) {
		t.Fatalf("wide.ext addresses on the wire: %v, want length %d", s.GetService().GetAddresses(), wide.Bits())
	}

	port := func(ip netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(ip, p) }
	e.expectConn(port(a.IP, 8081), "wide.ext", port(a.IP, 8081))
	e.expectConn(port(c.IP, 8081), "narrow.ext", port(c.IP, 8081))
	e.expectConn(port(b.IP, 8081), "exact.ext", port(b.IP, 8081))
	// Any address of the STATIC range reaches the endpoint.
	for _, ip := range []string{"10.77.0.1", "10.77.200.9"} {
		e.expectConn(port(netip.MustParseAddr(ip), 9000), "virtual.ext", port(b.IP, 8081))
	}

	// Removing the narrow entry hands its range back to the wide one.
	if err := e.store.ApplyAddresses(nil, []string{"egress/narrow.ext", "egress/virtual.ext",
		"Kubernetes/networking.istio.io/ServiceEntry/egress/virtual/" + b.IP.String()}); err != nil {
		t.Fatal(err)
	}
	e.expectConn(port(c.IP, 8081), "wide.ext", port(c.IP, 8081))
	// The range is no service now: passed through to an address nobody
	// has, so the node proxy's dial fails and the pod reads nothing.
	if got, err := roundTrip(t, e.client.Pod, port(netip.MustParseAddr("10.77.0.1"), 9000), nil); err == nil && len(got) > 0 {
		t.Errorf("10.77.0.1:9000 still answers %q after its ServiceEntry was removed", got)
	}
}

// TestServiceEntryNonePassthrough: a resolution NONE ServiceEntry (Istio
// 1.28) is a PASSTHROUGH service: connections to its address go to the
// original destination, never to an endpoint (this one lists one nobody
// listens on), and are reported as that service in metrics and the access
// log. Its wire form is istiod's: load balancing mode PASSTHROUGH with
// health policy ALLOW_ALL.
func TestServiceEntryNonePassthrough(t *testing.T) {
	e := newSEEnv(t)
	n1 := e.c.Node(1)
	a := e.addPod(n1, "ext-a", "ext", false)
	b := e.addPod(n1, "ext-b", "ext", false)
	se := serviceEntry("legacy", 1, "legacy.ext", networkingv1alpha3.ServiceEntry_NONE, 8081, a.IP.String(), b.IP.String())
	se.Spec.Endpoints = []*networkingv1alpha3.WorkloadEntry{{Address: "10.31.1.250"}} // nothing there
	res := e.apply(se)
	s, _ := res.Addresses.Get("egress/legacy.ext")
	if lb := s.GetService().GetLoadBalancing(); lb.GetMode() != workloadapi.LoadBalancing_PASSTHROUGH ||
		lb.GetHealthPolicy() != workloadapi.LoadBalancing_ALLOW_ALL {
		t.Fatalf("legacy.ext load balancing on the wire: %v, want PASSTHROUGH / ALLOW_ALL", lb)
	}
	for _, p := range []*meshPod{a, b, a} {
		dst := netip.AddrPortFrom(p.IP, 8081)
		e.expectConn(dst, "legacy.ext", dst)
	}
	// Not in the ServiceEntry: plain passthrough, no service named.
	other := e.addPod(n1, "ext-c", "ext", false)
	got, err := roundTrip(t, e.client.Pod, netip.AddrPortFrom(other.IP, 8081), nil)
	if err != nil || strings.TrimSpace(string(got)) != e.client.IP.String() {
		t.Fatalf("connection to %s (outside the mesh): %q (%v)", other.IP, got, err)
	}
	if n := len(e.accessLines(map[string]string{"dst.addr": fmt.Sprintf("%s:8081", other.IP), "dst.service": "legacy.ext"})); n != 0 {
		t.Errorf("a connection outside the ServiceEntry was attributed to it (%d lines)", n)
	}
}
