package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/dnsproxy"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// Issue 12's node-proxy items that need the namespace cluster.

// TestFailClosedDNSRestart: a pod with DNS capture on (the default) and
// the node proxy's whole per-pod set (15001, 15006, 15008 and the DNS
// proxy on 15053, built by the in-pod factory as the node proxy does) is
// handed over to a second node proxy that binds alongside the first, then
// the first drains. A DNS query loop (UDP and TCP, local answers and
// forwarded ones) and a new-connection loop run across the hand-over: no
// query and no new connection fails (issue 12 item 5).
func TestFailClosedDNSRestart(t *testing.T) {
	m := newMeshEnv(t)
	n := m.c.Node(0)
	ctx := ctxT(t, 2*time.Minute)
	dnsPod, err := n.AddPod(ctx, testcluster.PodSpec{Name: "coredns", Namespace: "kube-system", Uncaptured: true})
	if err != nil {
		t.Fatal(err)
	}
	startClusterDNS(t, dnsPod, map[string]netip.Addr{"ext.test.": netip.MustParseAddr("192.0.2.20")})
	server := m.addPod(n, "server", "server", false)
	client, err := n.AddPod(ctx, testcluster.PodSpec{Name: "client", Namespace: "demo", Uncaptured: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.store.ApplyAddresses(dnsMesh(client), nil); err != nil {
		t.Fatal(err)
	}
	h, err := client.Handle()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rules.InPod(rules.PodSettings{DNSCapture: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := rules.NewKernelApplier(rules.KernelConfig{Netns: h, Mode: rules.DetectMode()}).Apply(rs); err != nil {
		t.Fatal(err)
	}
	resolvConf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolvConf, []byte("nameserver "+dnsPod.IP.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fwd, err := dnsproxy.NewForwarder(dnsproxy.ForwarderConfig{ResolvConf: resolvConf, Mark: rules.ZtunnelMark})
	if err != nil {
		t.Fatal(err)
	}
	deps := m.deps(n)
	m.issue(meshID("demo", "default"))
	factory := &inpod.ProxyFactory{Proxy: deps, DNS: &inpod.DNSTemplate{
		Deps: dnsproxy.Deps{Store: m.store, Forwarder: fwd, Log: m.log.Named("dns")},
	}}
	w := inpod.Workload{UID: client.UID, Name: "client", Namespace: "demo"}
	start := func() (inpod.Proxy, chan error) {
		t.Helper()
		p, err := factory.NewProxy(w, h)
		if err != nil {
			t.Fatalf("node proxy for the pod: %v", err)
		}
		done := make(chan error, 1)
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			done <- p.Serve(context.Background())
		}()
		t.Cleanup(func() {
			p.Close()
			<-ended
		})
		return p, done
	}
	old, oldDone := start()

	// The pod's own resolver traffic: to the cluster DNS server's address,
	// captured to 15053 by the pod's rules.
	dnsServer := netip.AddrPortFrom(dnsPod.IP, 53)
	query := func(proto, name string, want netip.Addr) error {
		qctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		conn, err := client.Dial(qctx, proto, dnsServer.String())
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		dc := &dns.Conn{Conn: conn}
		if err := dc.WriteMsg(q); err != nil {
			return err
		}
		r, err := dc.ReadMsg()
		if err != nil {
			return err
		}
		if len(r.Answer) != 1 {
			return fmt.Errorf("answer %v (rcode %d)", r.Answer, r.Rcode)
		}
		if a, ok := r.Answer[0].(*dns.A); !ok || a.A.String() != want.String() {
			return fmt.Errorf("answer %v, want %s", r.Answer[0], want)
		}
		return nil
	}
	whoami := netip.AddrPortFrom(server.IP, 8081)
	for _, proto := range []string{"udp", "tcp"} {
		if err := query(proto, "api.example.com.", netip.MustParseAddr("240.240.0.1")); err != nil {
			t.Fatalf("before the hand-over: %s query: %v", proto, err)
		}
	}

	var (
		stop                            atomic.Bool
		wg                              sync.WaitGroup
		mu                              sync.Mutex
		failures                        []string
		queries, connections            atomic.Int64
		queriesAtHandover, connsAtHando atomic.Int64
	)
	fail := func(s string) {
		mu.Lock()
		failures = append(failures, s)
		mu.Unlock()
	}
	for i, q := range []struct {
		proto, name string
		want        netip.Addr
	}{
		{"udp", "api.example.com.", netip.MustParseAddr("240.240.0.1")},
		{"udp", "ext.test.", netip.MustParseAddr("192.0.2.20")},
		{"tcp", "api.example.com.", netip.MustParseAddr("240.240.0.1")},
		{"tcp", "ext.test.", netip.MustParseAddr("192.0.2.20")},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if err := query(q.proto, q.name, q.want); err != nil {
					fail(fmt.Sprintf("loop %d: %s %s: %v", i, q.proto, q.name, err))
				}
				queries.Add(1)
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			got, err := meshlab.RoundTrip(ctxT(t, 5*time.Second), client, whoami, nil)
			if err != nil || strings.TrimSpace(string(got)) != client.IP.String() {
				fail(fmt.Sprintf("new connection: %q (%v)", got, err))
			}
			connections.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}()

	time.Sleep(300 * time.Millisecond)
	// The hand-over: the new node proxy binds every per-pod port alongside
	// the old one, then the old one drains.
	queriesAtHandover.Store(queries.Load())
	connsAtHando.Store(connections.Load())
	_, newDone := start()
	time.Sleep(300 * time.Millisecond)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		old.Drain(context.Background(), 5*time.Second)
	}()
	select {
	case <-drained:
	case <-time.After(15 * time.Second):
		t.Error("the old proxy's drain did not end")
	}
	if err := <-oldDone; err != nil {
		t.Errorf("old proxy Serve: %v", err)
	}
	time.Sleep(500 * time.Millisecond) // the new proxy alone
	stop.Store(true)
	wg.Wait()
	select {
	case err := <-newDone:
		t.Errorf("the new proxy stopped: %v", err)
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	for i, f := range failures {
		if i < 20 {
			t.Error(f)
		}
	}
	if len(failures) > 0 {
		t.Fatalf("%d failures across the hand-over (%d queries, %d new connections)", len(failures), queries.Load(), connections.Load())
	}
	during := queries.Load() - queriesAtHandover.Load()
	if during < 100 || connections.Load()-connsAtHando.Load() < 20 {
		t.Fatalf("only %d queries and %d new connections after the hand-over began; the loops did not run", during,
			connections.Load()-connsAtHando.Load())
	}
	t.Logf("%d queries and %d new connections, none failed", queries.Load(), connections.Load())
}

// TestFailClosedEgressServiceEntry: a captured pod reaches a server outside
// the mesh (an uncaptured pod on the other node that the control plane
// does not know) through a ServiceEntry with resolution DNS, by name (the
// DNS proxy answers the auto-allocated address, the node proxy resolves the
// name through the pod's upstream resolver, a DNS server the test runs),
// and through one with resolution NONE, by IP (passed through to the
// original destination). Both are attributed to their ServiceEntry host in
// the metrics and the access log (issue 12 item 7).
func TestFailClosedEgressServiceEntry(t *testing.T) {
	m := newMeshEnv(t)
	n := m.c.Node(0)
	ctx := ctxT(t, 2*time.Minute)
	external := m.addPod(m.c.Node(1), "external", "external", false)
	dnsPod, err := n.AddPod(ctx, testcluster.PodSpec{Name: "coredns", Namespace: "kube-system", Uncaptured: true})
	if err != nil {
		t.Fatal(err)
	}
	upstream := startClusterDNS(t, dnsPod, map[string]netip.Addr{"ext.example.com.": external.IP})
	client, err := n.AddPod(ctx, testcluster.PodSpec{Name: "client", Namespace: "demo", Uncaptured: true})
	if err != nil {
		t.Fatal(err)
	}
	const vip = "240.240.0.5" // auto-allocated for ext.example.com
	uid := "Kubernetes//Pod/demo/client"
	mesh := map[string]*workloadapi.Address{
		uid: {Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
			Uid: uid, Name: "client", Namespace: "demo", Addresses: [][]byte{client.IP.AsSlice()},
			TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Node: n.Name, CanonicalName: "client", CanonicalRevision: "v1",
		}}},
		// resolution: DNS, no endpoints: one workload with the host as
		// its hostname, as the control plane translates it.
		"egress/ext.example.com": {Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: "ext", Namespace: "egress", Hostname: "ext.example.com",
			Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr(vip).AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8081}},
		}}},
		"Kubernetes/networking.istio.io/ServiceEntry/egress/ext/ext.example.com": {Type: &workloadapi.Address_Workload{
			Workload: &workloadapi.Workload{
				Uid:  "Kubernetes/networking.istio.io/ServiceEntry/egress/ext/ext.example.com",
				Name: "ext", Namespace: "egress", Hostname: "ext.example.com", WorkloadName: "ext",
				Services: map[string]*workloadapi.PortList{"egress/ext.example.com": {
					Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8081}}}},
			}}},
		// resolution: NONE with the server's address: PASSTHROUGH.
		"egress/none.example.com": {Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: "none", Namespace: "egress", Hostname: "none.example.com",
			Addresses: []*workloadapi.NetworkAddress{{Address: external.IP.AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 8081}},
			LoadBalancing: &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_PASSTHROUGH,
				HealthPolicy: workloadapi.LoadBalancing_ALLOW_ALL},
		}}},
	}
	if err := m.store.ApplyAddresses(mesh, nil); err != nil {
		t.Fatal(err)
	}
	h, err := client.Handle()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rules.InPod(rules.PodSettings{DNSCapture: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := rules.NewKernelApplier(rules.KernelConfig{Netns: h, Mode: rules.DetectMode()}).Apply(rs); err != nil {
		t.Fatal(err)
	}
	resolvConf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolvConf, []byte("nameserver "+dnsPod.IP.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fwd, err := dnsproxy.NewForwarder(dnsproxy.ForwarderConfig{ResolvConf: resolvConf, Mark: rules.ZtunnelMark})
	if err != nil {
		t.Fatal(err)
	}
	m.issue(meshID("demo", "default"))
	// The node proxy as cmd/ztunnel builds it: the in-pod factory gives
	// the data path a resolver over the DNS proxy's upstreams.
	factory := &inpod.ProxyFactory{Proxy: m.deps(n), DNS: &inpod.DNSTemplate{
		Deps: dnsproxy.Deps{Store: m.store, Forwarder: fwd, Log: m.log.Named("dns")},
	}}
	p, err := factory.NewProxy(inpod.Workload{UID: client.UID, Name: "client", Namespace: "demo"}, h)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(context.Background()) }()
	t.Cleanup(func() {
		p.Close()
		<-served
	})

	// By name: the pod's resolver gets the auto-allocated address...
	r := podExchange(ctx, t, client, "udp", netip.AddrPortFrom(dnsPod.IP, 53), "ext.example.com.", dns.TypeA)
	if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != vip {
		t.Fatalf("ext.example.com from the pod = %v, want %s (the DNS proxy's answer)", r.Answer, vip)
	}
	before := upstream.count("ext.example.com.")
	// ...and connections to it reach the external server, which sees the
	// pod's own address.
	for i := range 3 {
		got, err := roundTrip(t, client, netip.MustParseAddrPort(vip+":80"), nil)
		if err != nil || strings.TrimSpace(string(got)) != client.IP.String() {
			t.Fatalf("resolution DNS, connection %d to %s:80: %q (%v)", i, vip, got, err)
		}
	}
	if got := upstream.count("ext.example.com.") - before; got < 1 || got > 2 {
		t.Errorf("the node proxy resolved ext.example.com %d times for 3 connections, want once (A; AAAA), cached by TTL", got)
	}
	// By IP: passed through to the original destination.
	got, err := roundTrip(t, client, netip.AddrPortFrom(external.IP, 8081), nil)
	if err != nil || strings.TrimSpace(string(got)) != client.IP.String() {
		t.Fatalf("resolution NONE, connection to %s:8081: %q (%v)", external.IP, got, err)
	}

	for host, want := range map[string]float64{"ext.example.com": 3, "none.example.com": 1} {
		labels := map[string]string{"reporter": "source", "destination_service": host, "response_flags": "-",
			"source_workload": "client"}
		deadline := time.Now().Add(5 * time.Second)
		for m.metric("istio_tcp_connections_closed_total", labels) < want && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if got := m.metric("istio_tcp_connections_closed_total", labels); got != want {
			t.Errorf("istio_tcp_connections_closed_total%v = %v, want %v", labels, got, want)
		}
		if got := m.metric("istio_tcp_connections_opened_total", labels); got != want {
			t.Errorf("istio_tcp_connections_opened_total%v = %v, want %v", labels, got, want)
		}
	}
	if got := len(m.accessLines(map[string]string{"dst.service": "ext.example.com", "dst.workload": "ext",
		"dst.addr": netip.AddrPortFrom(external.IP, 8081).String()})); got != 3 {
		t.Errorf("%d access-log lines for ext.example.com naming the resolved address, want 3", got)
	}
}
