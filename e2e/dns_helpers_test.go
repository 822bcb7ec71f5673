package e2e

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// clusterDNS is a stand-in for the cluster's DNS server: a miekg/dns server
// on <pod IP>:53 (UDP and TCP) in an uncaptured pod. It answers the names
// it knows with one A record, NXDOMAIN otherwise, and records who asked.
type clusterDNS struct {
	mu   sync.Mutex
	seen map[string]int
	srcs map[netip.Addr]bool
}

func startClusterDNS(t *testing.T, pod *testcluster.Pod, names map[string]netip.Addr) *clusterDNS {
	t.Helper()
	cd := &clusterDNS{seen: map[string]int{}, srcs: map[netip.Addr]bool{}}
	addr := netip.AddrPortFrom(pod.IP, 53).String()
	pc, err := pod.ListenPacket(addr)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := pod.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		q := r.Question[0]
		var src netip.Addr
		switch a := w.RemoteAddr().(type) {
		case *net.UDPAddr:
			src = a.AddrPort().Addr().Unmap()
		case *net.TCPAddr:
			src = a.AddrPort().Addr().Unmap()
		}
		cd.mu.Lock()
		cd.seen[dns.CanonicalName(q.Name)]++
		cd.srcs[src] = true
		cd.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(r)
		ip, ok := names[dns.CanonicalName(q.Name)]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: ip.AsSlice()}}
		}
		w.WriteMsg(m)
	})
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go s.ActivateAndServe()
		<-started
		t.Cleanup(func() { s.Shutdown() })
	}
	return cd
}

func (cd *clusterDNS) count(name string) int {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	return cd.seen[name]
}

func (cd *clusterDNS) sources() []netip.Addr {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	var out []netip.Addr
	for a := range cd.srcs {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// dnsMesh is the WDS state of the DNS test: the client pod and the
// ServiceEntry host api.example.com with its auto-allocated address.
func dnsMesh(client *testcluster.Pod) map[string]*workloadapi.Address {
	uid := "Kubernetes//Pod/demo/client"
	return map[string]*workloadapi.Address{
		uid: {Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
			Uid: uid, Name: "client", Namespace: "demo", Addresses: [][]byte{client.IP.AsSlice()},
			TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Node: client.Node.Name,
			CanonicalName: "client", CanonicalRevision: "v1",
		}}},
		"demo/api.example.com": {Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
			Name: "api", Namespace: "demo", Hostname: "api.example.com",
			Addresses: []*workloadapi.NetworkAddress{{Address: netip.MustParseAddr("240.240.0.1").AsSlice()}},
			Ports:     []*workloadapi.Port{{ServicePort: 443, TargetPort: 443}},
		}}},
	}
}

// podExchange sends one query from inside pod to server.
func podExchange(ctx context.Context, t *testing.T, pod *testcluster.Pod, proto string, server netip.AddrPort, name string, qtype uint16) *dns.Msg {
	t.Helper()
	conn, err := pod.Dial(ctx, proto, server.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	dc := &dns.Conn{Conn: conn}
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if err := dc.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	r, err := dc.ReadMsg()
	if err != nil {
		t.Fatalf("%s %s via %s: %v", proto, name, server, err)
	}
	return r
}

// metricsCounter sums a counter family of reg into one counter, for
// testutil.ToFloat64.
func metricsCounter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Counter {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name})
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			c.Add(m.GetCounter().GetValue())
		}
	}
	return c
}
