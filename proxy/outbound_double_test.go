package proxy

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/drain"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestOutboundDoubleHBONE drives serveOutbound to a service whose only
// endpoint is on another network, behind a network gateway: the gateway
// (an hbone.Server with hostname authorities) sees the outer CONNECT for
// the service and forwards the stream unread to the final destination's
// HBONE server, which sees the client's identity and network through the
// inner mTLS. The access log and metrics name the final workload and the
// service, with the gateway as dst.addr.
func TestOutboundDoubleHBONE(t *testing.T) {
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	certs := identity.NewStaticSource()
	var (
		clientID  = identity.MustNew("cluster.local", "apps", "sa-client")
		gatewayID = identity.MustNew("cluster.local", "istio-system", "sa-ew")
		finalID   = identity.MustNew("cluster.local", "apps", "sa-reviews-east")
	)
	for _, id := range []identity.Identity{clientID, gatewayID, finalID} {
		wc, err := authority.Issue(id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		certs.Set(wc)
	}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln
	}
	serve := func(cfg hbone.ServerConfig) net.Listener {
		s, err := hbone.NewServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ln := listen()
		go s.Serve(ln)
		t.Cleanup(func() { s.Close() })
		return ln
	}
	var mu sync.Mutex
	var outer, inner []*hbone.Request
	var respBaggage atomic.Value // the final server's response baggage
	// The final destination's node proxy: echoes inside the tunnel.
	finalLn := serve(hbone.ServerConfig{Identity: finalID, Certs: certs, AcceptHostnames: true,
		Handler: hbone.HandlerFunc(func(_ context.Context, req *hbone.Request) hbone.Reply {
			mu.Lock()
			inner = append(inner, req)
			mu.Unlock()
			b, _ := respBaggage.Load().(string)
			return hbone.Reply{Baggage: b, Serve: func(tun *hbone.Tunnel) error {
				_, err := io.Copy(tun, tun)
				tun.CloseWrite()
				return err
			}}
		})})
	// The network gateway: terminates the outer CONNECT, forwards the rest.
	gwLn := serve(hbone.ServerConfig{Identity: gatewayID, Certs: certs, AcceptHostnames: true,
		Handler: hbone.HandlerFunc(func(ctx context.Context, req *hbone.Request) hbone.Reply {
			mu.Lock()
			outer = append(outer, req)
			mu.Unlock()
			var d net.Dialer
			up, err := d.DialContext(ctx, "tcp", finalLn.Addr().String())
			if err != nil {
				return hbone.Reply{Status: 503}
			}
			return hbone.Reply{Upstream: up}
		})})
	var dialled []netip.AddrPort
	pool, err := hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: certs,
		Dial: func(ctx context.Context, _ netip.Addr, hop netip.AddrPort) (net.Conn, error) {
			mu.Lock()
			dialled = append(dialled, hop)
			mu.Unlock()
			var d net.Dialer
			return d.DialContext(ctx, "tcp", gwLn.Addr().String())
		}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })

	// The 15001 stand-in listens on the service's VIP, so what it accepts
	// is routed to the service.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2 on loopback: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	svcPort := uint32(ln.Addr().(*net.TCPAddr).Port)

	store := state.NewStore()
	k := pt.ServiceKey
	pt.Apply(t, store,
		pt.Pod("apps", "client", "127.0.0.1", pt.Network("west")),
		pt.Pod("apps", "reviews-east", "", pt.Network("east"), pt.ServiceAccount("sa-reviews-east"),
			pt.NetworkGateway(pt.GatewayIP("east", "172.16.0.1", 15008)), pt.InService(k("apps", "reviews"), svcPort, 9080)),
		pt.Pod("istio-system", "ew", "172.16.0.1", pt.Network("east"), pt.ServiceAccount("sa-ew")),
		pt.Service("apps", "reviews", "127.0.0.2", []uint32{svcPort, 9080}, func(s *workloadapi.Service) {
			s.Addresses[0].Network = "west"
		}),
	)
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	p := &WorkloadProxy{
		d: &Deps{Store: store, Certs: certs, Pool: pool, Metrics: NewMetrics(reg),
			Config: &config.Config{NodeName: "node0", TrustDomain: "cluster.local"}},
		info:     WorkloadInfo{Name: "client", Namespace: "apps", ServiceAccount: "sa-client"},
		id:       clientID,
		log:      zap.NewNop(),
		access:   zap.New(core),
		pool:     pool,
		group:    drain.New(),
		closedCh: make(chan struct{}),
	}
	p.ctx = p.group.Context()
	t.Cleanup(p.group.Close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			done, _ := p.group.Track()
			go p.serveOutbound(c, done)
		}
	}()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := "across the networks"
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo %q (%v), want %q", buf, err, msg)
	}
	c.Close()

	host := "reviews.apps.svc.cluster.local"
	waitLog(t, logs, map[string]string{
		"direction": "outbound", "dst.addr": "172.16.0.1:15008", "dst.hbone_addr": host + ":" + strconv.Itoa(int(svcPort)),
		"dst.service": host, "dst.workload": "reviews-east", "dst.namespace": "apps",
		"src.identity": clientID.String(), "dst.identity": finalID.String(),
		"bytes_sent": strconv.Itoa(len(msg)), "bytes_recv": strconv.Itoa(len(msg)), "reason": "",
	})
	mu.Lock()
	if len(dialled) != 1 || dialled[0] != netip.MustParseAddrPort("172.16.0.1:15008") {
		t.Errorf("pool dialled %v, want the gateway 172.16.0.1:15008 once", dialled)
	}
	if len(outer) != 1 || len(inner) != 1 {
		t.Fatalf("gateway saw %d CONNECTs, final %d; want 1 each", len(outer), len(inner))
	}
	o, i := outer[0], inner[0]
	if o.Host != host || o.Authority.Port() != uint16(svcPort) || o.Peer != clientID || o.HasForwardedNetwork {
		t.Errorf("outer CONNECT: host %q port %d peer %s x-forwarded-network %q; want %s:%d from %s, no network",
			o.Host, o.Authority.Port(), o.Peer, o.ForwardedNetwork, host, svcPort, clientID)
	}
	if i.Host != host || i.Authority.Port() != uint16(svcPort) || i.Peer != clientID || i.ForwardedNetwork != "west" {
		t.Errorf("inner CONNECT: host %q port %d peer %s x-forwarded-network %q; want %s:%d from %s, network west",
			i.Host, i.Authority.Port(), i.Peer, i.ForwardedNetwork, host, svcPort, clientID)
	}
	if hbone.ForwardedHost(i.Forwarded) != host || hbone.ParseBaggage(i.Baggage).WorkloadName != "client" {
		t.Errorf("inner forwarded %q baggage %q, want the service host and the client", i.Forwarded, i.Baggage)
	}
	labels := map[string]string{"reporter": "source", "destination_workload": "reviews-east",
		"destination_service": host, "destination_principal": finalID.String(), "connection_security_policy": "mutual_tls"}
	if n := gatherSum(t, reg, "istio_tcp_connections_opened_total", labels); n != 1 {
		t.Errorf("istio_tcp_connections_opened_total%v = %v, want 1", labels, n)
	}
	mu.Unlock()

	// The answer's baggage names another endpoint (the gateway balanced
	// elsewhere): believed within the namespace the inner certificate
	// proves, ignored for another namespace.
	for _, tc := range []struct{ ns, workload, namespace string }{
		{"apps", "reviews-east-2", "apps"},
		{"payments", "reviews-east", "apps"},
	} {
		respBaggage.Store(hbone.Baggage{Namespace: tc.ns, WorkloadType: "deployment", WorkloadName: "reviews-east-2"}.String())
		logs.TakeAll()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		c.Close()
		waitLog(t, logs, map[string]string{"direction": "outbound", "dst.workload": tc.workload, "dst.namespace": tc.namespace,
			"dst.identity": finalID.String()})
	}
}

// gatherSum sums the samples of counter name whose labels include want.
func gatherSum(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	samples:
		for _, m := range mf.GetMetric() {
			n := 0
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok {
					if v != l.GetValue() {
						continue samples
					}
					n++
				}
			}
			if n == len(want) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
