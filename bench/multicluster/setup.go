package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/proxy/eastwest"
)

// The mesh: the client's node proxy is on network "east"; the app, its
// node proxy and the east-west gateway are on network "west".
const (
	clientNetwork = "east"
	destNetwork   = "west"
	svcNS         = "bench"
	svcHost       = "echo.bench.svc.cluster.local"
	svcPort       = 80
)

var (
	clientID  = identity.MustNew("cluster.local", "bench", "client")
	destID    = identity.MustNew("cluster.local", svcNS, "echo")
	gatewayID = identity.MustNew("cluster.local", "istio-system", "istio-eastwestgateway")
	loopback  = netip.MustParseAddr("127.0.0.1")
)

// serveTCP accepts on 127.0.0.1:0 and runs serve for each connection.
func serveTCP(serve func(net.Conn)) (net.Listener, netip.AddrPort, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln, ln.Addr().(*net.TCPAddr).AddrPort(), nil
}

// echoConn is the application: it echoes until the client half-closes.
func echoConn(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 32<<10)
	io.CopyBuffer(c, struct{ io.Reader }{c}, buf)
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// startApp is the echo application.
func startApp() (net.Listener, netip.AddrPort, error) { return serveTCP(echoConn) }

// dest is the destination node proxy's inbound HBONE listener as far as
// latency goes: an hbone.Server with the app's identity that accepts the
// service's hostname:port (what a CONNECT through a gateway carries) and
// ip:port (what a same-network client sends), resolves it to the app, and
// dials the app before answering 200. It keeps no state, policy, metrics
// or access log: those the real inbound (proxy.WorkloadProxy) adds on top,
// equally on both paths.
type dest struct {
	srv  *hbone.Server
	ln   net.Listener
	addr netip.AddrPort
	// byHost and byAddr count the CONNECTs by authority kind.
	byHost, byAddr atomic.Int64
	// fromGateway counts the CONNECTs that carried x-forwarded-network
	// naming another network (the inner CONNECT of double HBONE).
	fromGateway atomic.Int64
}

func startDest(certs identity.CertSource, app netip.AddrPort) (*dest, error) {
	d := &dest{}
	var err error
	d.srv, err = hbone.NewServer(hbone.ServerConfig{
		Identity: destID, Certs: certs, AcceptHostnames: true,
		Handler: hbone.HandlerFunc(func(ctx context.Context, req *hbone.Request) hbone.Reply {
			if req.HasForwardedNetwork && !strings.EqualFold(req.ForwardedNetwork, destNetwork) {
				d.fromGateway.Add(1)
			}
			switch {
			case req.Host == svcHost && req.Authority.Port() == svcPort:
				d.byHost.Add(1)
			case req.Host == "" && req.Authority == app:
				d.byAddr.Add(1)
			default:
				return hbone.Reply{Status: 404}
			}
			var dl net.Dialer
			up, err := dl.DialContext(ctx, "tcp", app.String())
			if err != nil {
				return hbone.Reply{Status: 503}
			}
			return hbone.Reply{Upstream: up}
		}),
	})
	if err != nil {
		return nil, err
	}
	if d.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	d.addr = d.ln.Addr().(*net.TCPAddr).AddrPort()
	go d.srv.Serve(d.ln)
	return d, nil
}

func (d *dest) Close() { d.srv.Close() }

// gateway is the real east-west gateway (proxy/eastwest) on network west,
// with a workload API snapshot in which the echo service is global and
// its one endpoint is an HBONE pod at 127.0.0.1 whose HBONE port is the
// destination node proxy's listener.
type gateway struct {
	gw   *eastwest.Gateway
	reg  *prometheus.Registry
	addr netip.AddrPort
}

func startGateway(certs identity.CertSource, destHBONE netip.AddrPort) (*gateway, error) {
	st, err := gatewayState(destHBONE.Addr())
	if err != nil {
		return nil, err
	}
	g := &gateway{reg: prometheus.NewRegistry()}
	g.gw, err = eastwest.New(eastwest.Options{Identity: gatewayID, Certs: certs, State: st,
		Network: destNetwork, EndpointPort: destHBONE.Port(), Registerer: g.reg})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g.addr = ln.Addr().(*net.TCPAddr).AddrPort()
	go g.gw.Serve(ln)
	return g, nil
}

func (g *gateway) Close() { g.gw.Close() }

// forwarded is ztunnel_eastwest_connections_total{outcome="forwarded"}.
func (g *gateway) forwarded() (float64, error) {
	mfs, err := g.reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != "ztunnel_eastwest_connections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "outcome" && lp.GetValue() == "forwarded" {
					return m.GetCounter().GetValue(), nil
				}
			}
		}
	}
	return 0, nil
}

// gatewayState is the snapshot the gateway routes by: the global service
// echo.bench (port 80 → 8080) and its pod on network west at podIP.
func gatewayState(podIP netip.Addr) (*state.Store, error) {
	key := svcNS + "/" + svcHost
	svc := &workloadapi.Service{Name: "echo", Namespace: svcNS, Hostname: svcHost,
		Addresses:  []*workloadapi.NetworkAddress{{Network: destNetwork, Address: netip.MustParseAddr("10.96.0.10").AsSlice()}},
		Ports:      []*workloadapi.Port{{ServicePort: svcPort, TargetPort: 8080}},
		Extensions: []*workloadapi.Extension{{Name: state.GlobalScopeExtension}}}
	pod := &workloadapi.Workload{Uid: "Kubernetes//Pod/bench/echo-1", Name: "echo-1", Namespace: svcNS,
		Network: destNetwork, Addresses: [][]byte{podIP.AsSlice()}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		ServiceAccount: "echo", WorkloadType: workloadapi.WorkloadType_POD, WorkloadName: "echo",
		Services: map[string]*workloadapi.PortList{key: {Ports: []*workloadapi.Port{{ServicePort: svcPort, TargetPort: 8080}}}}}
	s := state.NewStore()
	err := s.ApplyAddresses(map[string]*workloadapi.Address{
		key:     {Type: &workloadapi.Address_Service{Service: svc}},
		pod.Uid: {Type: &workloadapi.Address_Workload{Workload: pod}},
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("gateway state: %w", err)
	}
	return s, nil
}

// client is the source node proxy's side: hbone.Pool requests as
// proxy/outbound.go builds them.
type client struct {
	certs   identity.CertSource
	app     netip.AddrPort // the app's address (direct, and the same-network authority)
	dest    netip.AddrPort // the destination node proxy's HBONE listener
	gateway netip.AddrPort // the east-west gateway
}

func (c *client) pool() (*hbone.Pool, error) {
	return hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: c.certs, ConnectTimeout: 10 * time.Second}})
}

// forwarded is the Forwarded header the node proxy sends (client 10.0.0.1).
var forwarded = hbone.BuildForwarded(netip.MustParseAddrPort("10.0.0.1:40000"), svcHost)

// same opens a tunnel on the same network: CONNECT ip:port straight to
// the destination's node proxy.
func (c *client) same(ctx context.Context, p *hbone.Pool) (*hbone.Tunnel, error) {
	return p.Connect(ctx, &hbone.ConnectRequest{
		Key:       hbone.Key{Src: clientID, Dst: []identity.Identity{destID}, SrcIP: loopback, NextHop: c.dest},
		Authority: c.app, Forwarded: forwarded,
	})
}

// cross opens a tunnel across networks: double HBONE, the outer CONNECT
// hostname:port to the gateway, the inner one to the destination's node
// proxy through it.
func (c *client) cross(ctx context.Context, p *hbone.Pool) (*hbone.Tunnel, error) {
	outer := &hbone.ConnectRequest{
		Key:       hbone.Key{Src: clientID, Dst: []identity.Identity{gatewayID}, SrcIP: loopback, NextHop: c.gateway},
		Authority: netip.AddrPortFrom(netip.Addr{}, svcPort), Host: svcHost, Forwarded: forwarded,
	}
	inner := *outer
	inner.Key.Dst = []identity.Identity{destID}
	inner.ForwardedNetwork = clientNetwork
	return p.ConnectThrough(ctx, outer, &inner)
}

// issue issues id's certificate from c.
func issue(c *ca.CA, id identity.Identity) (*identity.StaticSource, error) {
	wc, err := c.Issue(id, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	return identity.NewStaticSource(wc), nil
}
