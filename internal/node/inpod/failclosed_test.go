package inpod

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/dnsproxy"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/proxy"
)

// TestFailClosedDNSSelfByUID: several clusters have a pod demo/client on a
// node named node0, each on its own network. The DNS proxy the in-pod
// manager starts for our pod answers a query from loopback as our pod, the
// workload of this node proxy's cluster (its WDS uid), so a service's VIP
// comes from our network, never another cluster's (issue 12 item 10).
func TestFailClosedDNSSelfByUID(t *testing.T) {
	roottest.Require(t)
	pod := netnstest.New(t, "pod")
	store := state.NewStore()
	cfg := &config.Config{NodeName: "node0", ClusterID: "Kubernetes", TrustDomain: "cluster.local", PacketMark: 1337,
		InpodPortReuse: true, PoolMaxStreamsPerConn: 100, PoolUnusedRelease: time.Minute}
	f := &ProxyFactory{
		Proxy: &proxy.Deps{Store: store, Certs: identity.NewStaticSource(), Config: cfg},
		DNS:   &DNSTemplate{Deps: dnsproxy.Deps{Store: store}},
	}
	m, err := New(Config{DrainDeadline: time.Second}, Deps{Factory: f})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown(context.Background()) })

	const clusters = 64 // the other clusters' pods outnumber ours
	client := func(cluster, network string) *workloadapi.Address {
		return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
			Uid: cluster + "//Pod/demo/client", Name: "client", Namespace: "demo", Node: "node0",
			ClusterId: cluster, Network: network, ServiceAccount: "sa", TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		}}}
	}
	svc := &workloadapi.Service{Name: "svc", Namespace: "demo", Hostname: "svc.demo.svc.cluster.local",
		Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}
	up := map[string]*workloadapi.Address{"Kubernetes//Pod/demo/client": client("Kubernetes", "")}
	svc.Addresses = append(svc.Addresses, &workloadapi.NetworkAddress{Address: netip.MustParseAddr("10.96.0.10").AsSlice()})
	for i := range clusters {
		cluster, network := fmt.Sprintf("Cluster%02d", i), fmt.Sprintf("net%02d", i)
		up[cluster+"//Pod/demo/client"] = client(cluster, network)
		svc.Addresses = append(svc.Addresses, &workloadapi.NetworkAddress{Network: network,
			Address: netip.AddrFrom4([4]byte{10, 97, byte(i), 10}).AsSlice()})
	}
	up["demo/svc.demo.svc.cluster.local"] = &workloadapi.Address{Type: &workloadapi.Address_Service{Service: svc}}
	if err := store.ApplyAddresses(up, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Add("pod-uid-1", &zdsapi.WorkloadInfo{Name: "client", Namespace: "demo", ServiceAccount: "sa"},
		reopen(t, pod)); err != nil {
		t.Fatal(err)
	}

	dnsAddr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), dnsproxy.Port)
	for round := range 5 {
		// A fresh snapshot each round: no answer cached from the last one.
		if err := store.ApplyAddresses(map[string]*workloadapi.Address{"Kubernetes//Pod/demo/client": client("Kubernetes", "")}, nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := pod.Dial(ctx, "udp", dnsAddr, netns.SockOpts{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		q := new(dns.Msg)
		q.SetQuestion("svc.demo.svc.cluster.local.", dns.TypeA)
		dc := &dns.Conn{Conn: c}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := dc.WriteMsg(q); err != nil {
			t.Fatal(err)
		}
		r, err := dc.ReadMsg()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Answer) != 1 {
			t.Fatalf("round %d: answer %v, want one A record", round, r.Answer)
		}
		if a, ok := r.Answer[0].(*dns.A); !ok || a.A.String() != "10.96.0.10" {
			t.Fatalf("round %d: answer %v, want 10.96.0.10 (our network's VIP, not another cluster's)", round, r.Answer[0])
		}
	}
}
