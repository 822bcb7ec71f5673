package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Issue 5's end-to-end tests: the node proxy's data path (proxy.WorkloadProxy,
// in-process, one per captured pod) on a two-node cluster of network
// namespaces with the real in-pod capture rules (cni/rules applied with the
// kernel applier). The state is fed from WDS and authorization protobufs
// the test builds for the topology; certificates come from a test CA.
// Each TestProxy* test builds its own proxyMesh, so each runs alone by name
// and none depends on traffic or policies another left behind.
//
// Topology (namespace apps):
//
//	node0: client (sa client), other (sa other)        captured
//	node1: server (sa server)                           captured
//	node1: outside (not in the mesh), waypoint (sa waypoint, a test waypoint)
//
// Services: server 10.96.1.1 (80→8080 echo, 81→8081 whoami); wp-svc
// 10.96.1.2 (80→8080 on server) bound to the waypoint; waypoint 10.96.1.3
// (15008).
type proxyMesh struct {
	*meshEnv
	n0, n1                                   *testcluster.Node
	client, other, server, outside, waypoint *meshPod
	wp                                       *testWaypoint
}

// Addresses of the proxyMesh topology.
var (
	serverVIP  = netip.MustParseAddr("10.96.1.1")
	wpVIP      = netip.MustParseAddr("10.96.1.2")
	serverHost = pt.Hostname("apps", "server")
)

const (
	strictKey       = "istio-system/istio_converted_static_strict"
	clientP, otherP = "cluster.local/ns/apps/sa/client", "cluster.local/ns/apps/sa/other"
)

func newProxyMesh(t *testing.T) *proxyMesh {
	m := newMeshEnv(t)
	p := &proxyMesh{meshEnv: m, n0: m.c.Node(0), n1: m.c.Node(1)}
	p.client = m.addPod(p.n0, "client", "client", true)
	p.other = m.addPod(p.n0, "other", "other", true)
	p.server = m.addPod(p.n1, "server", "server", true)
	p.outside = m.addPod(p.n1, "outside", "outside", false)
	p.waypoint = m.addPod(p.n1, "waypoint", "waypoint", false)
	svcKey := pt.ServiceKey
	pt.Apply(t, m.store,
		pt.Pod("apps", "client", p.client.IP.String(), pt.OnNode(p.n0.Name), pt.ServiceAccount("client")),
		pt.Pod("apps", "other", p.other.IP.String(), pt.OnNode(p.n0.Name), pt.ServiceAccount("other")),
		p.serverWorkload(),
		pt.Pod("apps", "waypoint", p.waypoint.IP.String(), pt.OnNode(p.n1.Name), pt.ServiceAccount("waypoint"),
			pt.InService(svcKey("apps", "waypoint"), 15008, 15008)),
		pt.Service("apps", "server", serverVIP.String(), []uint32{80, 8080, 81, 8081}),
		pt.Service("apps", "wp-svc", wpVIP.String(), []uint32{80, 8080}, pt.ServiceWaypoint(pt.WaypointHost("apps", "waypoint"))),
		pt.Service("apps", "waypoint", "10.96.1.3", []uint32{15008, 15008}),
	)
	p.wp = startTestWaypoint(t, p.waypoint, map[netip.AddrPort]struct {
		next, authority netip.AddrPort
		id              identity.Identity
	}{
		netip.AddrPortFrom(wpVIP, 80): {netip.AddrPortFrom(p.server.IP, 15008), p.serverEcho(), p.server.id},
	})
	return p
}

// serverWorkload is the server's workload with the given policy keys.
func (p *proxyMesh) serverWorkload(policies ...string) *workloadapi.Address {
	svcKey := pt.ServiceKey
	return pt.Pod("apps", "server", p.server.IP.String(), pt.OnNode(p.n1.Name), pt.ServiceAccount("server"),
		pt.InService(svcKey("apps", "server"), 80, 8080, 81, 8081), pt.InService(svcKey("apps", "wp-svc"), 80, 8080),
		pt.Policies(policies...))
}

func (p *proxyMesh) serverEcho() netip.AddrPort  { return netip.AddrPortFrom(p.server.IP, 8080) }
func (p *proxyMesh) serverWhoAm() netip.AddrPort { return netip.AddrPortFrom(p.server.IP, 8081) }

// TestProxyTraffic: echo across nodes through the VIP and the pod IP, only
// HBONE on the underlay, the source IP kept, plaintext from outside the mesh,
// passthrough, a service bound to a waypoint, and the access log and metrics
// of that traffic.
func TestProxyTraffic(t *testing.T) {
	p := newProxyMesh(t)
	m, client, other, server, outside, waypoint, wp := p.meshEnv, p.client, p.other, p.server, p.outside, p.waypoint, p.wp
	serverEcho, serverWhoAm := p.serverEcho(), p.serverWhoAm()
	capture, err := m.c.CaptureUnderlay(ctxT(t, 10*time.Second), "tcp")
	if err != nil {
		t.Fatal(err)
	}
	const size = 4 << 20
	for _, tc := range []struct {
		name string
		from *meshPod
		dst  netip.AddrPort
	}{
		{"cross-node via service VIP", client, netip.AddrPortFrom(serverVIP, 80)},
		{"cross-node via pod IP", client, serverEcho},
		{"second client via service VIP", other, netip.AddrPortFrom(serverVIP, 80)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := payload(size)
			got, err := roundTrip(t, tc.from.Pod, tc.dst, want)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("echo of %d bytes: got %d bytes, equal=%v, err %v", size, len(got), bytes.Equal(got, want), err)
			}
		})
	}
	pkts, err := capture.Stop()
	if err != nil {
		t.Fatal(err)
	}
	hbonePkts := 0
	for _, p := range pkts {
		if p.Proto != "tcp" {
			continue
		}
		if p.Src.Port() != 15008 && p.Dst.Port() != 15008 {
			t.Errorf("underlay carried TCP outside HBONE: %s -> %s", p.Src, p.Dst)
		}
		if bytes.Contains(p.Payload, []byte(payloadMarker)) {
			t.Fatalf("underlay carried the payload in clear: %s -> %s", p.Src, p.Dst)
		}
		if len(p.Payload) > 0 {
			hbonePkts++
		}
	}
	if hbonePkts < 100 {
		t.Errorf("only %d HBONE data packets on the underlay for 3×4 MiB each way", hbonePkts)
	}

	// Single-answer cases: what the destination saw or said.
	for _, tc := range []struct {
		name string
		from *meshPod
		dst  netip.AddrPort
		want string
	}{
		// The app sees the client's own IP (IP_TRANSPARENT on the
		// destination side), through the VIP and the pod IP.
		{"source IP kept via VIP", client, netip.AddrPortFrom(serverVIP, 81), client.IP.String()},
		{"source IP kept via pod IP", other, serverWhoAm, other.IP.String()},
		// Plaintext from outside the mesh lands on 15006 (PERMISSIVE).
		{"plaintext from outside the mesh", outside, serverWhoAm, outside.IP.String()},
		// A destination the mesh does not know is passed through.
		{"passthrough to outside the mesh", client, netip.AddrPortFrom(outside.IP, 8081), client.IP.String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := roundTrip(t, tc.from.Pod, tc.dst, nil)
			if err != nil || strings.TrimSpace(string(got)) != tc.want {
				t.Fatalf("got %q (err %v), want %q", got, err, tc.want)
			}
		})
	}

	t.Run("service bound to a waypoint", func(t *testing.T) {
		want := payload(1 << 20)
		got, err := roundTrip(t, client.Pod, netip.AddrPortFrom(wpVIP, 80), want)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("echo via waypoint: %d bytes, err %v", len(got), err)
		}
		auths, peers := wp.seen()
		if len(auths) != 1 || auths[0] != "10.96.1.2:80" || peers[0] != client.id.String() {
			t.Fatalf("waypoint saw authorities %q from %q; want the original VIP 10.96.1.2:80 from %s", auths, peers, client.id)
		}
		// The destination authorized the waypoint's identity and IP.
		// (Each side records when its own copy ends, which may be just
		// after the client saw EOF.)
		m.waitLines(t, 1, map[string]string{"direction": "inbound", "src.identity": waypoint.id.String(),
			"dst.hbone_addr": serverEcho.String(), "bytes_sent": fmt.Sprint(1 << 20)})
		m.waitLines(t, 1, map[string]string{"direction": "outbound", "dst.addr": netip.AddrPortFrom(waypoint.IP, 15008).String(),
			"dst.hbone_addr": "10.96.1.2:80", "dst.service": pt.Hostname("apps", "wp-svc"), "dst.identity": waypoint.id.String(),
			"bytes_sent": fmt.Sprint(1 << 20)})
	})

	// Telemetry of the traffic above.
	// Inbound lines of the client's two 4 MiB transfers: identities from
	// mTLS and the control plane, bytes, and the service: from the
	// forwarded header (via the VIP) or, to the pod IP, guessed by the
	// target port as Istio's ztunnel does.
	m.waitLines(t, 2, map[string]string{
		"direction": "inbound", "src.identity": client.id.String(), "dst.identity": server.id.String(),
		"dst.service": serverHost, "src.workload": "client", "dst.workload": "server",
		"bytes_sent": fmt.Sprint(4 << 20), "bytes_recv": fmt.Sprint(4 << 20),
		"dst.addr": netip.AddrPortFrom(server.IP, 15008).String(), "dst.hbone_addr": serverEcho.String(),
	})
	m.waitLines(t, 1, map[string]string{
		"direction": "outbound", "src.identity": client.id.String(), "dst.identity": server.id.String(),
		"dst.service": serverHost, "dst.addr": netip.AddrPortFrom(server.IP, 15008).String(),
		"dst.hbone_addr": serverEcho.String(), "bytes_sent": fmt.Sprint(4 << 20), "bytes_recv": fmt.Sprint(4 << 20),
	})
	base := map[string]string{
		"source_workload": "client", "source_principal": client.id.String(),
		"destination_workload": "server", "destination_principal": server.id.String(),
		"destination_service": serverHost, "connection_security_policy": "mutual_tls",
	}
	with := func(kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range base {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	for _, tc := range []struct {
		metric  string
		labels  map[string]string
		atLeast float64
	}{
		{"istio_tcp_connections_opened_total", with("reporter", "destination", "response_flags", "-"), 2},
		{"istio_tcp_connections_closed_total", with("reporter", "source", "response_flags", "-"), 2},
		{"istio_tcp_received_bytes_total", with("reporter", "destination", "response_flags", "-"), 4 << 20},
		{"istio_tcp_sent_bytes_total", with("reporter", "destination", "response_flags", "-"), 4 << 20},
		{"istio_tcp_received_bytes_total", with("reporter", "source", "response_flags", "-"), 4 << 20},
		{"istio_tcp_connections_closed_total", map[string]string{"reporter": "source", "source_workload": "client",
			"destination_workload": "unknown", "connection_security_policy": "unknown", "response_flags": "-"}, 1},
	} {
		if got := m.metric(tc.metric, tc.labels); got < tc.atLeast {
			t.Errorf("%s%v = %v, want >= %v", tc.metric, tc.labels, got, tc.atLeast)
		}
	}
}

// TestProxyAuthorization: each row installs policies, then every client
// tries the server's echo port and whoami port.
func TestProxyAuthorization(t *testing.T) {
	p := newProxyMesh(t)
	m, client, other, server := p.meshEnv, p.client, p.other, p.server
	serverEcho, serverWhoAm := p.serverEcho(), p.serverWhoAm()
	allow := securityapi.Action_ALLOW
	deny := securityapi.Action_DENY
	for _, tc := range []struct {
		name     string
		policies []*securityapi.Authorization
		// want[client][dst]: allowed?
		client8080, client8081, other8080 bool
	}{
		{"no policies", nil, true, true, true},
		{"allow by principal", []*securityapi.Authorization{
			pt.Policy("apps", "allow-client", allow, pt.Rule(pt.Principals(clientP))),
		}, true, true, false},
		{"deny wins over allow", []*securityapi.Authorization{
			pt.Policy("apps", "allow-both", allow, pt.Rule(pt.Principals(clientP, otherP))),
			pt.Policy("apps", "deny-client", deny, pt.Rule(pt.Principals(clientP))),
		}, false, false, true},
		{"empty allow denies everything", []*securityapi.Authorization{
			pt.Policy("apps", "allow-nothing", allow),
		}, false, false, false},
		{"port-scoped allow", []*securityapi.Authorization{
			pt.Policy("apps", "allow-8081", allow, pt.Rule(pt.Ports(8081))),
		}, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pt.ApplyPolicies(t, m.store, tc.policies...)
			t.Cleanup(func() {
				var keys []string
				for _, p := range tc.policies {
					keys = append(keys, p.Namespace+"/"+p.Name)
				}
				pt.RemovePolicies(t, m.store, keys...)
			})
			for _, probe := range []struct {
				from *meshPod
				dst  netip.AddrPort
				want bool
			}{
				{client, netip.AddrPortFrom(serverVIP, 80), tc.client8080},
				{client, serverWhoAm, tc.client8081},
				{other, serverEcho, tc.other8080},
			} {
				msg := []byte("hello " + probe.from.Name)
				got, err := roundTrip(t, probe.from.Pod, probe.dst, msg)
				allowed := err == nil && len(got) > 0
				if allowed != probe.want {
					t.Errorf("%s -> %s: allowed=%v (got %q, err %v), want %v", probe.from.Name, probe.dst, allowed, got, err, probe.want)
				}
			}
		})
	}
	// The destination logged the denials with its identities.
	if got := m.accessLines(map[string]string{"direction": "inbound", "reason": "policy_denied",
		"src.identity": other.id.String(), "dst.identity": server.id.String()}); len(got) == 0 {
		t.Error("no inbound policy_denied line for other -> server")
	}
	labels := map[string]string{"reporter": "destination", "response_flags": "DENY",
		"source_workload": "client", "source_principal": client.id.String(),
		"destination_workload": "server", "destination_principal": server.id.String(),
		"destination_service": serverHost, "connection_security_policy": "mutual_tls"}
	if got := m.metric("istio_tcp_connections_closed_total", labels); got < 1 {
		t.Errorf("istio_tcp_connections_closed_total%v = %v, want >= 1", labels, got)
	}
}

// TestProxyPeerAuthentication: STRICT refuses plaintext from outside the
// mesh and keeps mTLS working, PERMISSIVE lets plaintext in again.
func TestProxyPeerAuthentication(t *testing.T) {
	p := newProxyMesh(t)
	m, client, server, outside := p.meshEnv, p.client, p.server, p.outside
	serverWhoAm, serverWorkload := p.serverWhoAm(), p.serverWorkload
	labels := map[string]string{"reporter": "destination", "response_flags": "DENY",
		"source_principal": "unknown", "connection_security_policy": "unknown", "destination_workload": "server"}
	defer func() {
		if got := m.metric("istio_tcp_connections_closed_total", labels); got < 1 {
			t.Errorf("istio_tcp_connections_closed_total%v = %v, want >= 1", labels, got)
		}
	}()
	for _, tc := range []struct {
		name   string
		strict bool
	}{{"strict", true}, {"permissive", false}, {"strict again", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.strict {
				pt.ApplyPolicies(t, m.store, pt.StrictPolicy("istio-system"))
				pt.Apply(t, m.store, serverWorkload(strictKey))
			} else {
				pt.Apply(t, m.store, serverWorkload())
			}
			got, err := roundTrip(t, outside.Pod, serverWhoAm, nil)
			if plainOK := err == nil && len(got) > 0; plainOK == tc.strict {
				t.Errorf("plaintext from outside: allowed=%v (%q, %v), want %v", plainOK, got, err, !tc.strict)
			}
			got, err = roundTrip(t, client.Pod, serverWhoAm, nil)
			if err != nil || strings.TrimSpace(string(got)) != client.IP.String() {
				t.Errorf("mTLS from client: %q (%v), want allowed", got, err)
			}
		})
	}
	pt.Apply(t, m.store, serverWorkload())
	pt.RemovePolicies(t, m.store, strictKey)
	for _, f := range m.linesFrom(outside.IP, map[string]string{"direction": "inbound", "reason": "policy_denied",
		"dst.identity": server.id.String()}) {
		if f["src.identity"] != nil {
			t.Errorf("plaintext denial logged a source identity: %v", f)
		}
		return
	}
	t.Error("no inbound policy_denied line for the plaintext client")
}

// TestProxyPolicyChange: a policy that denies an open connection's source
// closes it within a second, over HBONE and over plaintext.
func TestProxyPolicyChange(t *testing.T) {
	p := newProxyMesh(t)
	m, client, outside := p.meshEnv, p.client, p.outside
	serverEcho := p.serverEcho()
	deny := securityapi.Action_DENY
	for _, tc := range []struct {
		name string
		from *meshPod
		dst  netip.AddrPort
	}{
		{"hbone", client, netip.AddrPortFrom(serverVIP, 80)},
		{"plaintext", outside, serverEcho},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.from.Dial(ctxT(t, 5*time.Second), "tcp", tc.dst.String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "ping"); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, buf); err != nil {
				t.Fatalf("echo before the change: %v", err)
			}
			// Deny this source from now on.
			policy := pt.Policy("apps", "deny-"+tc.from.Name, deny, pt.Rule(pt.Principals(clientP)))
			if tc.from == outside {
				policy = pt.Policy("apps", "deny-outside", deny, pt.Rule(&securityapi.Match{
					SourceIps: []*securityapi.Address{{Address: outside.IP.AsSlice(), Length: 32}},
				}))
			}
			start := time.Now()
			pt.ApplyPolicies(t, m.store, policy)
			defer pt.RemovePolicies(t, m.store, "apps/"+policy.Name)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			took := time.Since(start)
			var ne net.Error
			if n != 0 || err == nil || errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("read after the policy change: %d bytes, err %v; want the connection closed", n, err)
			}
			t.Logf("closed %v after the policy change", took)
			if took > time.Second {
				t.Errorf("closed after %v; want within a second", took)
			}
			testkit.Eventually(t, waitTimeout, "the revoked line", func() bool {
				return len(m.linesFrom(tc.from.IP, map[string]string{"direction": "inbound", "reason": "revoked"})) > 0
			})
		})
	}
}

// TestProxyRestartWhileDraining: a new node proxy binds the pod's ports
// while the old one drains; a long transfer through the old one finishes
// intact and new connections reach the new one.
func TestProxyRestartWhileDraining(t *testing.T) {
	p := newProxyMesh(t)
	client, serverWhoAm := p.client, p.serverWhoAm()
	// A long paced transfer through client's current proxy...
	const chunks, chunk = 64, 64 << 10
	c, err := client.Dial(ctxT(t, 5*time.Second), "tcp", netip.AddrPortFrom(serverVIP, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sum := sha256.New()
	werr := make(chan error, 1)
	go func() {
		data := payload(chunk)
		for i := 0; i < chunks; i++ {
			if _, err := c.Write(data); err != nil {
				werr <- err
				return
			}
			sum.Write(data)
			time.Sleep(15 * time.Millisecond)
		}
		werr <- c.(*net.TCPConn).CloseWrite()
	}()
	back := sha256.New()
	rerr := make(chan error, 1)
	var nBack int64
	go func() {
		var err error
		nBack, err = io.Copy(back, c)
		rerr <- err
	}()
	time.Sleep(200 * time.Millisecond)
	// ...while a new proxy binds the same ports and the old one drains.
	old := client.proxy
	client.proxy = client.startProxy()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		old.Drain(context.Background(), 10*time.Second)
	}()
	for i := 0; i < 5; i++ {
		got, err := roundTrip(t, client.Pod, serverWhoAm, nil)
		if err != nil || strings.TrimSpace(string(got)) != client.IP.String() {
			t.Errorf("new connection %d during the overlap: %q (%v)", i, got, err)
		}
	}
	if err := <-werr; err != nil {
		t.Fatalf("long transfer write: %v", err)
	}
	if err := <-rerr; err != nil {
		t.Fatalf("long transfer read: %v", err)
	}
	if nBack != chunks*chunk || !bytes.Equal(sum.Sum(nil), back.Sum(nil)) {
		t.Fatalf("long transfer: %d bytes back, want %d intact", nBack, chunks*chunk)
	}
	select {
	case <-drained:
	case <-time.After(15 * time.Second):
		t.Fatal("Drain did not return")
	}
	got, err := roundTrip(t, client.Pod, serverWhoAm, nil)
	if err != nil || strings.TrimSpace(string(got)) != client.IP.String() {
		t.Errorf("after the drain: %q (%v)", got, err)
	}
}

// waitLines waits (bounded) until exactly n access-log lines match want.
func (m *meshEnv) waitLines(t *testing.T, n int, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := len(m.accessLines(want))
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d access-log lines match %v, want %d", got, want, n)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// linesFrom returns the access-log lines matching want whose source
// address is ip.
func (m *meshEnv) linesFrom(ip netip.Addr, want map[string]string) []map[string]any {
	var out []map[string]any
	for _, f := range m.accessLines(want) {
		if ap, err := netip.ParseAddrPort(fmt.Sprint(f["src.addr"])); err == nil && ap.Addr() == ip {
			out = append(out, f)
		}
	}
	return out
}
