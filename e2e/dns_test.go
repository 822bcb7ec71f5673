package e2e

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/dnsproxy"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// TestDNSCapture runs the DNS proxy in a captured pod of the netns cluster.
// The pod's resolver points at a "cluster DNS" server in an uncaptured pod
// (kube-system/coredns, which answers api.example.com and ext.test with its
// own addresses and NXDOMAIN otherwise). With the pod's DNS capture rules,
// the query for the ServiceEntry host api.example.com is redirected to the
// proxy on 127.0.0.1:15053 (the OUTPUT-chain REDIRECT lands on loopback)
// and answered with the host's auto-allocated 240.240.0.1; unknown names are
// forwarded from a marked socket in the pod (not captured again) and come
// back with the cluster DNS answer. Without DNS capture, the same queries
// reach the cluster DNS server itself.
func TestDNSCapture(t *testing.T) {
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	c := testcluster.New(t, testcluster.Options{})
	node := c.Node(0)
	dnsPod, err := node.AddPod(ctx, testcluster.PodSpec{Name: "coredns", Namespace: "kube-system", Uncaptured: true})
	if err != nil {
		t.Fatal(err)
	}
	client, err := node.AddPod(ctx, testcluster.PodSpec{Name: "client", Namespace: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	clusterDNS := startClusterDNS(t, dnsPod, map[string]netip.Addr{
		"api.example.com.": netip.MustParseAddr("192.0.2.10"),
		"ext.test.":        netip.MustParseAddr("192.0.2.20"),
	})

	// The mesh: the client pod and a ServiceEntry host whose address the
	// control plane auto-allocated.
	store := state.NewStore()
	if err := store.ApplyAddresses(dnsMesh(client), nil); err != nil {
		t.Fatal(err)
	}

	h, err := client.Handle()
	if err != nil {
		t.Fatal(err)
	}
	// The node proxy's own resolv.conf names the cluster DNS server.
	resolvConf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolvConf, []byte("search kube-system.svc.cluster.local svc.cluster.local\nnameserver "+
		dnsPod.IP.String()+"\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fwd, err := dnsproxy.NewForwarder(dnsproxy.ForwarderConfig{ResolvConf: resolvConf})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics := dnsproxy.NewMetrics(reg)
	core, logs := observer.New(zapcore.DebugLevel)
	srv, err := dnsproxy.New(dnsproxy.Config{Workload: dnsproxy.WorkloadInfo{Namespace: "demo", Name: "client"}},
		dnsproxy.Deps{Store: store, Forwarder: fwd, Netns: h, Metrics: metrics, Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.Addrs(); len(got) == 0 || got[0] != netip.MustParseAddrPort("127.0.0.1:15053") {
		t.Fatalf("proxy listens on %v, want 127.0.0.1:15053 first", got)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})

	applier := rules.NewKernelApplier(rules.KernelConfig{Netns: h, Mode: rules.DetectMode()})
	// The pod's resolver: glibc-like, configured with the cluster DNS
	// server, its sockets in the pod.
	dnsServer := netip.AddrPortFrom(dnsPod.IP, 53)
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return client.Dial(ctx, network[:3], dnsServer.String())
	}}
	upstreamCount := func() float64 {
		return testutil.ToFloat64(metricsCounter(t, reg, "istio_dns_upstream_requests_total"))
	}

	for _, tc := range []struct {
		name    string
		capture bool
		// want is the A answer for api.example.com.
		want netip.Addr
	}{
		{name: "capture on", capture: true, want: netip.MustParseAddr("240.240.0.1")},
		{name: "capture off", capture: false, want: netip.MustParseAddr("192.0.2.10")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := rules.InPod(rules.PodSettings{DNSCapture: tc.capture})
			if err != nil {
				t.Fatal(err)
			}
			if err := applier.Apply(rs); err != nil {
				t.Fatal(err)
			}
			fwdBefore, seenBefore := upstreamCount(), clusterDNS.count("ext.test.")

			// The pod's resolver (UDP).
			ips, err := resolver.LookupNetIP(ctx, "ip4", "api.example.com")
			if err != nil || !slices.Equal(ips, []netip.Addr{tc.want}) {
				t.Errorf("resolver: api.example.com = %v (%v), want [%s]", ips, err, tc.want)
			}
			// With the header checked: the proxy's answer is authoritative,
			// the cluster DNS server's is not. Over TCP only with capture:
			// without it the pod's TCP goes to the node proxy's outbound
			// listener (15001), which this test does not run.
			protos := []string{"udp"}
			if tc.capture {
				protos = append(protos, "tcp")
			}
			for _, proto := range protos {
				r := podExchange(ctx, t, client, proto, dnsServer, "api.example.com.", dns.TypeA)
				if len(r.Answer) != 1 || !r.Answer[0].(*dns.A).A.Equal(tc.want.AsSlice()) || r.Authoritative != tc.capture {
					t.Errorf("%s: api.example.com: %v, want %s with aa=%v", proto, r, tc.want, tc.capture)
				}
			}
			// An unknown name is answered by the cluster DNS server either
			// way; with capture on, through the proxy's forwarder.
			ips, err = resolver.LookupNetIP(ctx, "ip4", "ext.test")
			if err != nil || !slices.Equal(ips, []netip.Addr{netip.MustParseAddr("192.0.2.20")}) {
				t.Errorf("resolver: ext.test = %v (%v), want [192.0.2.20]", ips, err)
			}
			r := podExchange(ctx, t, client, "udp", dnsServer, "missing.test.", dns.TypeA)
			if r.Rcode != dns.RcodeNameError {
				t.Errorf("missing.test: rcode %s, want NXDOMAIN from the cluster DNS server", dns.RcodeToString[r.Rcode])
			}
			if got := clusterDNS.count("ext.test.") - seenBefore; got < 1 {
				t.Errorf("cluster DNS server saw ext.test %d times, want at least once", got)
			}
			// Every query the cluster DNS server saw came from the pod's
			// own address: the forwarder's socket lives in the pod.
			if srcs := clusterDNS.sources(); len(srcs) != 1 || srcs[0] != client.IP {
				t.Errorf("cluster DNS query sources %v, want only the pod %s", srcs, client.IP)
			}
			forwarded := upstreamCount() - fwdBefore
			switch {
			case tc.capture && forwarded < 2:
				t.Errorf("proxy forwarded %v queries, want ext.test and missing.test forwarded", forwarded)
			case !tc.capture && forwarded != 0:
				t.Errorf("proxy forwarded %v queries with capture off, want 0", forwarded)
			}
		})
	}
	// The proxy saw the pod's queries with their original source: the
	// REDIRECT changed only the destination.
	answered := logs.FilterMessage("dns query").FilterField(zap.String("result", "answered")).All()
	if len(answered) == 0 {
		t.Fatal("no answered query in the proxy's log")
	}
	for _, e := range answered {
		src, _ := netip.ParseAddrPort(e.ContextMap()["src.addr"].(string))
		if src.Addr() != client.IP || e.ContextMap()["src.workload"] != "client" {
			t.Errorf("answered query from %v (workload %v), want from the pod %s", src, e.ContextMap()["src.workload"], client.IP)
		}
	}
}
