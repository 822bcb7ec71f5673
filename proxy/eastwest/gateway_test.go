package eastwest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

var (
	// clientID is the node proxy on the other network that sends double
	// HBONE; gatewayID the gateway; destID the destination workload.
	clientID  = identity.MustNew("cluster.local", "istio-system", "ztunnel")
	gatewayID = identity.MustNew("cluster.local", "istio-system", "istio-eastwestgateway")
	destID    = identity.MustNew("cluster.local", echoNS, "echo")
)

// Loopback addresses stand for pod IPs on the gateway's network.
var (
	endpointIP = netip.MustParseAddr("127.0.0.2")
	waypointIP = netip.MustParseAddr("127.0.0.4")
)

type lab struct {
	certs *identity.StaticSource
	gw    *Gateway
	addr  netip.AddrPort // the gateway's listener
	port  uint16         // the HBONE port every "pod" listens on
	lns   map[netip.Addr]net.Listener
	logs  *observer.ObservedLogs
	reg   *prometheus.Registry
}

// newLab starts a gateway on network west whose endpoints' HBONE port is
// one port that listeners on each of ips hold (pods on loopback IPs).
func newLab(t *testing.T, res []*workloadapi.Address, ips ...netip.Addr) *lab {
	t.Helper()
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wcs []*identity.WorkloadCertificate
	for _, id := range []identity.Identity{clientID, gatewayID, destID} {
		wc, err := c.Issue(id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		wcs = append(wcs, wc)
	}
	l := &lab{certs: identity.NewStaticSource(wcs...), lns: map[netip.Addr]net.Listener{}, reg: prometheus.NewRegistry()}
	l.port = listenSamePort(t, l.lns, ips)
	core, logs := observer.New(zap.DebugLevel)
	l.logs = logs
	// The waypoint addresses in res name port 0 for "the lab's port".
	for _, r := range res {
		if s := r.GetService(); s != nil && s.Waypoint != nil && s.Waypoint.HboneMtlsPort == 0 {
			s.Waypoint.HboneMtlsPort = uint32(l.port)
		}
	}
	l.gw, err = New(Options{Identity: gatewayID, Certs: l.certs, State: store(t, res...), Network: west,
		EndpointPort: l.port, Log: zap.New(core), Registerer: l.reg})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.addr = ln.Addr().(*net.TCPAddr).AddrPort()
	go l.gw.Serve(ln)
	t.Cleanup(func() { l.gw.Close() })
	return l
}

// listenSamePort listens on one port on every ip (retrying when another
// process holds the port on one of them) and returns it.
func listenSamePort(t *testing.T, into map[netip.Addr]net.Listener, ips []netip.Addr) uint16 {
	t.Helper()
	if len(ips) == 0 {
		return 1 // nothing listens: dialling it fails
	}
	for try := 0; try < 20; try++ {
		first, err := net.Listen("tcp", netip.AddrPortFrom(ips[0], 0).String())
		if err != nil {
			t.Skipf("cannot listen on %s: %v", ips[0], err)
		}
		port := first.Addr().(*net.TCPAddr).AddrPort().Port()
		got := []net.Listener{first}
		for _, ip := range ips[1:] {
			ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, port).String())
			if err != nil {
				break
			}
			got = append(got, ln)
		}
		if len(got) == len(ips) {
			for i, ln := range got {
				into[ips[i]] = ln
				t.Cleanup(func() { ln.Close() })
			}
			return port
		}
		for _, ln := range got {
			ln.Close()
		}
	}
	t.Fatal("no port free on every test IP")
	return 0
}

// connect opens the outer tunnel: an HBONE connection to the gateway as
// the remote node proxy, CONNECT host:port.
func (l *lab) connect(t *testing.T, ctx context.Context, host string, port uint16) (*hbone.Tunnel, error) {
	t.Helper()
	cc, err := hbone.Dial(ctx, &hbone.ClientConfig{Certs: l.certs}, hbone.Key{Src: clientID, Dst: []identity.Identity{gatewayID}, NextHop: l.addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc.Connect(ctx, &hbone.ConnectRequest{Authority: netip.AddrPortFrom(netip.Addr{}, port), Host: host})
}

// counter reads ztunnel_eastwest_connections_total{outcome, reason}.
func (l *lab) counter(t *testing.T, outcome, reason string) float64 {
	t.Helper()
	mfs, err := l.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ztunnel_eastwest_connections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["outcome"] == outcome && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func echoMesh(opts ...svcOpt) []*workloadapi.Address {
	return []*workloadapi.Address{service(echoNS, "echo", echoSvc, vip, append([]svcOpt{global}, opts...)...),
		pod(echoNS, "echo-1", west, endpointIP, echoKey)}
}

// TestInnerHBONEReachesDestination: a real inner HBONE connection (mutual
// TLS and HTTP/2) travels through the outer tunnel to the destination's
// HBONE server. The destination's TLS handshake proves the client's own
// identity, not the gateway's, and sees the inner CONNECT's hostname
// authority: the gateway never terminated the inner connection.
func TestInnerHBONEReachesDestination(t *testing.T) {
	l := newLab(t, echoMesh(), endpointIP)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	type seen struct {
		peer identity.Identity
		host string
	}
	got := make(chan seen, 1)
	dest, err := hbone.NewServer(hbone.ServerConfig{Identity: destID, Certs: l.certs, AcceptHostnames: true,
		Handler: hbone.HandlerFunc(func(ctx context.Context, req *hbone.Request) hbone.Reply {
			got <- seen{req.Peer, fmt.Sprintf("%s:%d", req.Host, req.Authority.Port())}
			var d net.Dialer
			up, err := d.DialContext(ctx, "tcp", echo.Addr().String())
			if err != nil {
				return hbone.Reply{Status: 503}
			}
			return hbone.Reply{Upstream: up}
		})})
	if err != nil {
		t.Fatal(err)
	}
	go dest.Serve(l.lns[endpointIP])
	defer dest.Close()

	outer, err := l.connect(t, ctx, echoSvc, 80)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := hbone.Dial(ctx, &hbone.ClientConfig{Certs: l.certs,
		Dial: func(context.Context, netip.Addr, netip.AddrPort) (net.Conn, error) { return outer, nil }},
		hbone.Key{Src: clientID, Dst: []identity.Identity{destID}, NextHop: netip.AddrPortFrom(endpointIP, l.port)})
	if err != nil {
		t.Fatalf("inner HBONE handshake through the gateway: %v", err)
	}
	defer inner.Close()
	if inner.PeerIdentity() != destID {
		t.Fatalf("inner peer %s, want the destination %s", inner.PeerIdentity(), destID)
	}
	tun, err := inner.Connect(ctx, &hbone.ConnectRequest{Authority: netip.AddrPortFrom(netip.Addr{}, 80), Host: echoSvc})
	if err != nil {
		t.Fatal(err)
	}
	s := <-got
	if s.peer != clientID || s.host != echoSvc+":80" {
		t.Fatalf("destination saw peer %s authority %s, want %s %s:80", s.peer, s.host, clientID, echoSvc)
	}
	msg := []byte("hello across networks")
	if _, err := tun.Write(msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(tun, buf); err != nil || !bytes.Equal(buf, msg) {
		t.Fatalf("echo %q, %v", buf, err)
	}
	if n := l.counter(t, "forwarded", ""); n != 1 {
		t.Errorf("forwarded counter %v, want 1", n)
	}
}

// opaqueDest accepts one connection on ln, reads it to EOF into got and
// answers reply.
func opaqueDest(ln net.Listener, reply []byte) (got chan []byte, conns *atomic.Int32) {
	got, conns = make(chan []byte, 1), &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				got <- b
				c.Write(reply)
			}()
		}
	}()
	return got, conns
}

// sendOpaque writes b through the outer tunnel, half-closes, and returns
// what comes back.
func sendOpaque(t *testing.T, tun *hbone.Tunnel, b []byte) []byte {
	t.Helper()
	if _, err := tun.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := tun.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	back, err := io.ReadAll(tun)
	if err != nil {
		t.Fatal(err)
	}
	return back
}

// A TLS ClientHello record header and the start of its body: the gateway
// must pass it on as is, not take it for its own TLS.
var tlsLooking = []byte{0x16, 0x03, 0x01, 0x00, 0x2f, 0x01, 0x00, 0x00, 0x2b, 0x03, 0x03, 'i', 'n', 'n', 'e', 'r'}

// TestOpaqueBytesReachEndpointHBONEPort: the gateway dials the endpoint's
// HBONE port and passes the bytes unchanged both ways, half-close
// included.
func TestOpaqueBytesReachEndpointHBONEPort(t *testing.T) {
	l := newLab(t, echoMesh(), endpointIP)
	got, _ := opaqueDest(l.lns[endpointIP], []byte("from the destination"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tun, err := l.connect(t, ctx, echoSvc, 80)
	if err != nil {
		t.Fatal(err)
	}
	back := sendOpaque(t, tun, tlsLooking)
	if b := <-got; !bytes.Equal(b, tlsLooking) {
		t.Fatalf("destination got %x, want %x", b, tlsLooking)
	}
	if string(back) != "from the destination" {
		t.Fatalf("client got %q", back)
	}
}

// TestWaypointInsteadOfEndpoint: a service with a waypoint is forwarded to
// the waypoint's HBONE port; its endpoint is never dialled.
func TestWaypointInsteadOfEndpoint(t *testing.T) {
	res := append(echoMesh(waypointAddr(west, waypointIP, 0)),
		pod("infra", "wp-1", west, waypointIP, "", tcpOnly))
	l := newLab(t, res, endpointIP, waypointIP)
	_, endpointConns := opaqueDest(l.lns[endpointIP], nil)
	got, _ := opaqueDest(l.lns[waypointIP], []byte("waypoint"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tun, err := l.connect(t, ctx, echoSvc, 80)
	if err != nil {
		t.Fatal(err)
	}
	if back := sendOpaque(t, tun, tlsLooking); string(back) != "waypoint" {
		t.Fatalf("client got %q, want the waypoint's answer", back)
	}
	if b := <-got; !bytes.Equal(b, tlsLooking) {
		t.Fatalf("waypoint got %x", b)
	}
	if n := endpointConns.Load(); n != 0 {
		t.Fatalf("the endpoint was dialled %d times, bypassing the waypoint", n)
	}
}

// TestRefusals: what the gateway does not forward is answered with a
// status, counted by reason and logged once with the hostname and reason.
func TestRefusals(t *testing.T) {
	res := []*workloadapi.Address{
		service(echoNS, "echo", echoSvc, vip, global), pod(echoNS, "echo-1", west, endpointIP, echoKey),
		service(echoNS, "local", "local.demo.svc.cluster.local", wpVIP), pod(echoNS, "local-1", west, endpointIP, "demo/local.demo.svc.cluster.local"),
		service(echoNS, "far", "far.demo.svc.cluster.local", netip.MustParseAddr("10.96.0.30"), global),
		pod(echoNS, "far-1", east, podEast, "demo/far.demo.svc.cluster.local"),
	}
	l := newLab(t, res, endpointIP)
	_, conns := opaqueDest(l.lns[endpointIP], nil)
	for _, tc := range []struct {
		host   string
		port   uint16
		status int
		reason string
	}{
		{"nothing.demo.svc.cluster.local", 80, 404, "unknown_host"},
		{"local.demo.svc.cluster.local", 80, 404, "not_global"},
		{echoSvc, 9090, 404, "unknown_port"},
		{"far.demo.svc.cluster.local", 80, 503, "no_endpoint"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := l.connect(t, ctx, tc.host, tc.port)
			var se *hbone.StatusError
			if !errors.As(err, &se) || se.Code != tc.status {
				t.Fatalf("err = %v, want status %d", err, tc.status)
			}
			if n := l.counter(t, "refused", tc.reason); n != 1 {
				t.Errorf("refused{%s} = %v, want 1", tc.reason, n)
			}
			lines := l.logs.FilterMessage("eastwest: refused").FilterField(zap.String("host", tc.host)).All()
			if len(lines) != 1 || lines[0].ContextMap()["reason"] != tc.reason {
				t.Errorf("log lines %+v, want one with reason %s", lines, tc.reason)
			}
		})
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("a refused CONNECT dialled the endpoint (%d connections)", n)
	}
}

// TestIPAuthorityRefused: the gateway routes by hostname only; an ip:port
// authority (a client that is not speaking double HBONE) gets 400.
func TestIPAuthorityRefused(t *testing.T) {
	l := newLab(t, echoMesh(), endpointIP)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cc, err := hbone.Dial(ctx, &hbone.ClientConfig{Certs: l.certs}, hbone.Key{Src: clientID, Dst: []identity.Identity{gatewayID}, NextHop: l.addr})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, err = cc.Connect(ctx, &hbone.ConnectRequest{Authority: netip.AddrPortFrom(endpointIP, 8080)})
	var se *hbone.StatusError
	if !errors.As(err, &se) || se.Code != 400 {
		t.Fatalf("err = %v, want 400", err)
	}
	if lines := l.logs.FilterMessage("eastwest: refused").All(); len(lines) != 1 ||
		!strings.Contains(fmt.Sprint(lines[0].ContextMap()["error"]), "hostname") {
		t.Errorf("log lines %+v", lines)
	}
}
