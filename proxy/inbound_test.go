package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
	"github.com/ztunnel-go/ztunnel-go/proxy/route"
)

// connectHost sends one CONNECT naming host:port to the pod's 15008 as
// peer.
func (e *podEnv) connectHost(t *testing.T, host string, port uint16) (*hbone.Tunnel, error) {
	cc, err := hbone.Dial(context.Background(), &hbone.ClientConfig{
		Certs: e.certs,
		Dial: func(ctx context.Context, _ netip.Addr, hop netip.AddrPort) (net.Conn, error) {
			return e.ns.Dial(ctx, "tcp", hop, netns.SockOpts{Mark: 1337})
		},
	}, hbone.Key{
		Src: identity.MustNew("cluster.local", "apps", "peer"), Dst: []identity.Identity{e.id},
		NextHop: netip.AddrPortFrom(podIP, route.HBONEPort),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return cc.Connect(ctx, &hbone.ConnectRequest{Authority: netip.AddrPortFrom(netip.Addr{}, port), Host: host})
}

// TestInboundHBONEHostname: a CONNECT naming a service by hostname (Istio
// 1.26) lands on this pod's target port for that service, through the
// same policy and metrics as an ip:port CONNECT; a name this pod cannot
// serve is refused with 503, as upstream ztunnel does.
func TestInboundHBONEHostname(t *testing.T) {
	e := newPodEnv(t)
	k := pt.ServiceKey
	pt.Apply(t, e.store,
		pt.Pod("apps", "pod", podIP.String(),
			pt.InService(k("apps", "reviews"), 9080, 8080),
			pt.InService(k("apps", "named"), 9081, 8080),
			pt.InService(k("apps", "denied"), 80, 9999)),
		pt.Pod("apps", "elsewhere", "10.55.9.9", pt.InService(k("apps", "other"), 80, 8080)),
		pt.Service("apps", "reviews", "10.96.55.1", []uint32{9080, 8080}),
		pt.Service("apps", "named", "10.96.55.2", []uint32{9081, 0}), // named target port: from the pod's map
		pt.Service("apps", "denied", "10.96.55.3", []uint32{80, 9999}),
		pt.Service("apps", "other", "10.96.55.4", []uint32{80, 8080}),
	)
	pt.ApplyPolicies(t, e.store, pt.Policy("apps", "deny-9999", securityapi.Action_DENY, pt.Rule(pt.Ports(9999))))
	for _, tc := range []struct {
		name   string
		host   string
		port   uint16
		status int // 0: 200
		reason string
		err    error // the cause the access log names
	}{
		{"service port to target port", pt.Hostname("apps", "reviews"), 9080, 0, "", nil},
		{"upper case is the same name", strings.ToUpper(pt.Hostname("apps", "reviews")), 9080, 0, "", nil},
		{"named port from the endpoint", pt.Hostname("apps", "named"), 9081, 0, "", nil},
		{"policy sees the resolved port", pt.Hostname("apps", "denied"), 80, 401, "policy_denied", nil},
		{"unknown hostname", pt.Hostname("apps", "nope"), 80, 503, "unknown_destination", route.ErrUnknownHostname},
		{"service without this pod", pt.Hostname("apps", "other"), 80, 503, "unknown_destination", route.ErrNotLocalHostname},
		{"undeclared service port", pt.Hostname("apps", "reviews"), 9999, 503, "unknown_destination", route.ErrNoTargetPort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tun, err := e.connectHost(t, tc.host, tc.port)
			if tc.status == 0 {
				if err != nil {
					t.Fatal(err)
				}
				defer tun.Close()
				line := make([]byte, 64)
				n, _ := tun.Read(line)
				if want := "app 10.55.0.1:8080 from"; !strings.HasPrefix(string(line[:n]), want) {
					t.Fatalf("tunnel read %q, want %q", line[:n], want)
				}
				return
			}
			var se *hbone.StatusError
			if !errors.As(err, &se) || se.Code != tc.status {
				t.Fatalf("err = %v, want status %d", err, tc.status)
			}
			waitLog(t, e.logs, map[string]string{"direction": "inbound", "reason": tc.reason})
			if tc.err != nil {
				want := tc.host + ":" + strconv.Itoa(int(tc.port)) + ": " + tc.err.Error()
				found := false
				for _, l := range e.logs.FilterMessage("connection complete").All() {
					if msg, _ := l.ContextMap()["error"].(string); strings.Contains(msg, want) {
						found = true
					}
				}
				if !found {
					t.Errorf("no access-log line with error %q", want)
				}
			}
		})
	}
	// The service the name resolved to labels the metrics (from the
	// control plane, not the header).
	e.waitMetric(t, "istio_tcp_connections_opened_total", map[string]string{
		"reporter": "destination", "destination_service": pt.Hostname("apps", "reviews"),
		"destination_service_name": "reviews"}, 2)
}

// TestServiceVIP: a PROXY header names the service by one of its
// addresses.
func TestServiceVIP(t *testing.T) {
	s := state.NewStore()
	pt.Apply(t, s, pt.Service("apps", "guarded", "10.96.0.10", []uint32{80, 8080}))
	if vip, ok := serviceVIP(s.Load().ServiceByHost(pt.ServiceKey("apps", "guarded")), ""); !ok || vip != netip.MustParseAddr("10.96.0.10") {
		t.Errorf("serviceVIP = %v, %v", vip, ok)
	}
}

// TestInboundApplicationTunnel: for a workload with an application tunnel
// of protocol PROXY the proxy connects to loopback on the tunnel's port and
// sends, before the payload, exactly the PROXY v2 header AppendProxyV2
// (tested byte for byte) builds from the HBONE client, the authority and
// the client's identity; a tunnel port that is one of the proxy's own is
// refused as a self-call.
func TestInboundApplicationTunnel(t *testing.T) {
	e := newPodEnv(t)
	tunnelPort := func(port uint32) pt.WorkloadOpt {
		return func(w *workloadapi.Workload) {
			w.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_PROXY, Port: port}
		}
	}
	pt.Apply(t, e.store, pt.Pod("apps", "pod", podIP.String(), tunnelPort(15088)))
	ln, err := e.ns.Listen(context.Background(), netip.MustParseAddrPort("127.0.0.1:15088"), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	type seen struct {
		from netip.AddrPort
		data []byte
	}
	got := make(chan seen, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		// The fixed part, the rest its length field declares, then the
		// payload the client sends ("payload").
		buf := make([]byte, 16)
		if _, err := io.ReadFull(c, buf); err == nil {
			rest := make([]byte, (int(buf[14])<<8|int(buf[15]))+len("payload"))
			n, _ := io.ReadFull(c, rest)
			buf = append(buf, rest[:n]...)
		}
		got <- seen{c.RemoteAddr().(*net.TCPAddr).AddrPort(), buf}
		c.Write([]byte("ok"))
	}()

	tun, err := e.connect(t, "10.55.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	if _, err := tun.Write([]byte("payload")); err != nil {
		t.Fatal(err)
	}
	var s seen
	select {
	case s = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel's listener got nothing")
	}
	if s.from.Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("tunnel connection from %s, want loopback", s.from)
	}
	// The PROXY source is the HBONE client: the tunnel's local address.
	client := tun.LocalAddr().(*net.TCPAddr).AddrPort()
	peer := identity.MustNew("cluster.local", "apps", "peer")
	want, err := AppendProxyV2(nil, netip.AddrPortFrom(client.Addr().Unmap(), client.Port()), netip.MustParseAddrPort("10.55.0.1:8080"),
		ProxyV2TLV{Type: ProxyV2TLVPeerIdentity, Value: []byte(peer.String())})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 16+12+3+len(peer.String()) {
		t.Fatalf("expected a TCP4 header with one TLV, built % X", want)
	}
	if len(s.data) < len(want) || string(s.data[:len(want)]) != string(want) {
		t.Errorf("header % X\nwant    % X", s.data[:min(len(s.data), len(want))], want)
	} else if rest := string(s.data[len(want):]); rest != "payload" {
		t.Errorf("after the header: %q, want the payload", rest)
	}
	b := make([]byte, 2)
	if _, err := io.ReadFull(tun, b); err != nil || string(b) != "ok" {
		t.Errorf("answer through the tunnel %q, %v", b, err)
	}

	pt.Apply(t, e.store, pt.Pod("apps", "pod", podIP.String(), tunnelPort(route.HBONEPort)))
	_, err = e.connect(t, "10.55.0.1:8080")
	var se *hbone.StatusError
	if !errors.As(err, &se) || se.Code != 503 {
		t.Fatalf("tunnel on the proxy's own port: %v, want 503", err)
	}
	waitLog(t, e.logs, map[string]string{"direction": "inbound", "reason": "self_call"})
}

// TestServiceByTargetPort: a connection that names no service (a
// waypoint's pooled upstream) is labelled with the first of the pod's
// services mapping a port to the one it arrived on, as Istio's ztunnel
// guesses; none for a port no service maps, or an unknown port.
func TestServiceByTargetPort(t *testing.T) {
	s := state.NewStore()
	pt.Apply(t, s,
		pt.Pod("apps", "web", "10.0.0.5", pt.InService(pt.ServiceKey("apps", "web"), 80, 8080)),
		pt.Service("apps", "web", "10.96.0.5", []uint32{80, 8080}))
	snap := s.Load()
	local := snap.WorkloadByIP("", netip.MustParseAddr("10.0.0.5"))
	if svc := serviceByTargetPort(snap, local, 8080); svc == nil || svc.Name != "web" {
		t.Errorf("serviceByTargetPort(8080) = %v, want apps/web", svc)
	}
	for _, port := range []uint16{9090, 0} {
		if svc := serviceByTargetPort(snap, local, port); svc != nil {
			t.Errorf("serviceByTargetPort(%d) = %v, want none", port, svc.Name)
		}
	}
}

// TestInboundFromNetworkGateway: the inner CONNECT of double HBONE arrives
// from the network gateway with x-forwarded-network naming the client's
// network; the TCP peer's address is then not taken for the source
// workload (here it would be the pod itself), only the proven identity.
func TestInboundFromNetworkGateway(t *testing.T) {
	e := newPodEnv(t)
	k := pt.ServiceKey
	pt.Apply(t, e.store,
		pt.Pod("apps", "pod", podIP.String(), pt.InService(k("apps", "reviews"), 9080, 8080)),
		pt.Service("apps", "reviews", "10.96.55.1", []uint32{9080, 8080}),
		// A workload of cluster west makes west a cluster the state knows.
		pt.Pod("apps", "west-0", "10.77.0.1", pt.Network("east"), func(w *workloadapi.Workload) {
			w.ClusterId, w.Uid = "west", "west//Pod/apps/west-0"
		}),
	)
	peer := identity.MustNew("cluster.local", "apps", "peer")
	for i, tc := range []struct {
		network, baggageCluster, wantSrc, wantNS, wantCluster string
	}{
		// Another network, through a gateway: the namespace from the
		// certificate, the cluster from the baggage when known.
		{"east", "west", "", "apps", "west"},
		{"east", "mars", "", "apps", "unknown"},
		// No header: the address is a local workload's.
		{"", "", "pod", "apps", pt.Cluster},
	} {
		req := &hbone.ConnectRequest{Authority: netip.AddrPortFrom(netip.Addr{}, 9080), Host: pt.Hostname("apps", "reviews"),
			ForwardedNetwork: tc.network, Baggage: hbone.Baggage{ClusterName: tc.baggageCluster, Namespace: "apps"}.String()}
		tun, err := e.connectReq(t, req)
		if err != nil {
			t.Fatalf("x-forwarded-network %q: %v", tc.network, err)
		}
		line := make([]byte, 64)
		if n, _ := tun.Read(line); !strings.HasPrefix(string(line[:n]), "app 10.55.0.1:8080") {
			t.Fatalf("tunnel read %q, want the app", line[:n])
		}
		tun.Close()
		testkit.Eventually(t, 5*time.Second, "the connection's access-log line", func() bool {
			return len(e.logs.FilterMessage("connection complete").All()) > i
		})
		f := e.logs.FilterMessage("connection complete").All()[i].ContextMap()
		if f["src.workload"] != tc.wantSrc || f["src.namespace"] != tc.wantNS || f["src.identity"] != peer.String() || f["dst.service"] != pt.Hostname("apps", "reviews") {
			t.Errorf("x-forwarded-network %q: access log %v, want src.workload %q, src.namespace %q, src.identity %s", tc.network, f, tc.wantSrc, tc.wantNS, peer)
		}
		if n := gatherSum(t, e.reg, "istio_tcp_connections_opened_total", map[string]string{"reporter": "destination",
			"source_cluster": tc.wantCluster, "source_workload": orUnknown(tc.wantSrc)}); n < 1 {
			t.Errorf("x-forwarded-network %q, baggage cluster %q: no connection counted with source_cluster %q", tc.network, tc.baggageCluster, tc.wantCluster)
		}
	}
}
