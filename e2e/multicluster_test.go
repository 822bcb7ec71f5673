package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/mclab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestMulticluster is issue 30's end-to-end check of ambient multi-network
// multicluster: two clusters (two API servers, two control planes, two
// networks joined only through their east-west gateways, mclab), each
// reading the other through a remote secret. A global Service (endpoints in
// both clusters, PreferClose) is reached from each side on the local
// network first and, when the local endpoint goes unready, through the
// other network's gateway: on the wire between the networks there is only
// TLS to the gateway, the destination's node proxy sees the remote client's
// own identity, and an AuthorizationPolicy there admits or denies by it. A
// Service that is not global is not reachable across, and removing a
// remote secret drops the remote endpoints and nothing local.
func TestMulticluster(t *testing.T) {
	testkit.SkipShort(t, "two API servers and two meshes")
	lab, err := mclab.Start(t, mclab.Options{})
	if err != nil {
		t.Fatal(err)
	}
	east, west := lab.Clusters[0], lab.Clusters[1]
	ctx := ctxT(t, 150*time.Second)

	const ns, port = "app", 8080
	type side struct {
		*mclab.Cluster
		echo, client  *testcluster.Pod
		echoVIP       netip.Addr
		localVIP      netip.Addr
		intruder      *testcluster.Pod // west only
		localEndpoint *testcluster.Pod // east only
	}
	sides := map[string]*side{}
	for _, c := range lab.Clusters {
		s := &side{Cluster: c}
		sides[c.Name] = s
		if err := c.EnsureAmbientNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		if s.echoVIP, err = c.CreateService(ctx, mclab.ServiceSpec{
			Namespace: ns, Name: "echo", Labels: map[string]string{"istio.io/global": "true"},
			Selector: map[string]string{"app": "echo"}, Port: 80, TargetPort: port, TrafficDistribution: "PreferSameZone",
		}); err != nil {
			t.Fatal(err)
		}
		// Not global: the same Service in both clusters, an endpoint only in east.
		if s.localVIP, err = c.CreateService(ctx, mclab.ServiceSpec{
			Namespace: ns, Name: "local", Selector: map[string]string{"app": "local"}, Port: 80, TargetPort: port,
		}); err != nil {
			t.Fatal(err)
		}
		add := func(name, sa string, labels map[string]string) *testcluster.Pod {
			t.Helper()
			p, err := c.AddKubePod(ctx, meshlab.KubePod{PodSpec: testcluster.PodSpec{
				Name: name, Namespace: ns, ServiceAccount: sa, Labels: labels}})
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		s.echo = add("echo-"+c.Name, "echo", map[string]string{"app": "echo"})
		if err := c.ServeName(s.echo, port, c.Name+"/echo"); err != nil {
			t.Fatal(err)
		}
		s.client = add("client-"+c.Name, "client-"+c.Name, nil)
		if c == west {
			s.intruder = add("intruder", "intruder", nil)
		} else {
			s.localEndpoint = add("local-"+c.Name, "local", map[string]string{"app": "local"})
			if err := c.ServeName(s.localEndpoint, port, c.Name+"/local"); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range lab.Clusters {
		if err := c.ApplyRemoteSecret(ctx, c.Other()); err != nil {
			t.Fatal(err)
		}
	}
	uid := func(c *mclab.Cluster, pod string) string { return c.Name + "//Pod/" + ns + "/" + pod }
	hasWorkload := func(c *mclab.Cluster, u string) bool {
		ok, err := c.ProxyHasWorkload(ctx, 0, u)
		return err == nil && ok
	}
	// Each side's node proxy learns the other side's echo endpoint.
	for _, c := range lab.Clusters {
		o := c.Other()
		testkit.Eventually(t, 60*time.Second, c.Name+"'s node proxy to hold "+o.Name+"'s echo endpoint", func() bool {
			return hasWorkload(c, uid(o, "echo-"+o.Name))
		})
	}

	ask := func(p *testcluster.Pod, vip netip.Addr) (string, error) {
		return mclab.Ask(ctx, p, netip.AddrPortFrom(vip, 80))
	}
	// askAll asks n times and returns the distinct answers (or the error).
	askAll := func(t *testing.T, p *testcluster.Pod, vip netip.Addr, n int) map[string]int {
		t.Helper()
		got := map[string]int{}
		for range n {
			a, err := ask(p, vip)
			if err != nil {
				t.Fatalf("%s/%s -> %s:80: %v", p.Namespace, p.Name, vip, err)
			}
			got[a]++
		}
		return got
	}

	t.Run("local first", func(t *testing.T) {
		for _, c := range lab.Clusters {
			s := sides[c.Name]
			if got := askAll(t, s.client, s.echoVIP, 10); len(got) != 1 || got[c.Name+"/echo"] != 10 {
				t.Errorf("%s client -> echo: %v, want only %s/echo", c.Name, got, c.Name)
			}
		}
	})

	// failover makes c's echo unready, checks that c's client is answered
	// by the other cluster's echo, and returns what the WAN carried
	// meanwhile. It leaves the echo unready.
	failover := func(t *testing.T, c *mclab.Cluster) []testcluster.Packet {
		t.Helper()
		s, o := sides[c.Name], c.Other()
		// From before the first connection to the other network: the
		// outer connection to the gateway is pooled.
		capture, err := lab.CaptureWAN(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SetPodReady(ctx, s.echo, false); err != nil {
			t.Fatal(err)
		}
		testkit.EventuallyErr(t, 30*time.Second, c.Name+" client reaching "+o.Name+"/echo", func() error {
			a, err := ask(s.client, s.echoVIP)
			if err != nil || a != o.Name+"/echo" {
				return fmt.Errorf("answer %q, %v", a, err)
			}
			return nil
		})
		if got := askAll(t, s.client, s.echoVIP, 5); got[o.Name+"/echo"] != 5 {
			t.Errorf("%s client -> echo after failover: %v, want only %s/echo", c.Name, got, o.Name)
		}
		pkts, err := capture.Stop()
		if err != nil {
			t.Fatal(err)
		}
		return pkts
	}

	t.Run("west fails over to east", func(t *testing.T) {
		pkts := failover(t, west)
		checkWAN(t, pkts, west.GatewayIP, east.GatewayIP, "east/echo")

		// The destination's node proxy saw the west client's own identity.
		want := spiffe(ns, "client-west")
		if _, err := east.WaitAccessLog(ctx, 0, func(a meshlab.AccessLog) bool {
			return a.Str("direction") == "inbound" && a.Str("dst.workload") == "echo-east" && a.Str("src.identity") == want
		}); err != nil {
			t.Errorf("east node proxy: no inbound access log from %s: %v", want, err)
		}
		mfs, err := east.Metrics(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if n := meshlab.Counter(mfs, "istio_tcp_connections_opened_total", map[string]string{
			"reporter": "destination", "destination_workload": "echo-east", "source_principal": want,
			"connection_security_policy": "mutual_tls",
		}); n < 5 {
			t.Errorf("east node proxy metrics: %v mutual-TLS connections from %s, want >= 5", n, want)
		}
	})

	t.Run("authorization by the remote principal", func(t *testing.T) {
		istio := kubeClientsOf(t, east).Istio
		ap := &securityv1.AuthorizationPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "echo-from-west-client"},
			Spec: securityv1beta1.AuthorizationPolicy{
				Selector: &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "echo"}},
				Action:   securityv1beta1.AuthorizationPolicy_ALLOW,
				Rules: []*securityv1beta1.Rule{{From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{
					Principals: []string{"cluster.local/ns/" + ns + "/sa/client-west"}}}}}},
			},
		}
		if _, err := istio.SecurityV1().AuthorizationPolicies(ns).Create(ctx, ap, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = istio.SecurityV1().AuthorizationPolicies(ns).Delete(context.Background(), ap.Name, metav1.DeleteOptions{})
		}()
		intruder := sides["west"].intruder
		testkit.EventuallyErr(t, 30*time.Second, "west intruder denied by east's policy", func() error {
			if a, err := ask(intruder, sides["west"].echoVIP); err == nil {
				return fmt.Errorf("intruder answered %q", a)
			}
			return nil
		})
		if got := askAll(t, sides["west"].client, sides["west"].echoVIP, 3); got["east/echo"] != 3 {
			t.Errorf("west client (allowed) -> echo: %v, want east/echo", got)
		}
		if _, err := east.WaitAccessLog(ctx, 0, func(a meshlab.AccessLog) bool {
			return a.Str("direction") == "inbound" && a.Str("src.identity") == spiffe(ns, "intruder") &&
				strings.Contains(a.Str("reason"), "policy")
		}); err != nil {
			t.Errorf("east node proxy: no policy denial of the west intruder logged: %v", err)
		}
	})

	t.Run("not global: not across", func(t *testing.T) {
		if a, err := ask(sides["east"].client, sides["east"].localVIP); err != nil || a != "east/local" {
			t.Fatalf("east client -> its own local service: %q, %v", a, err)
		}
		if a, err := ask(sides["west"].client, sides["west"].localVIP); err == nil {
			t.Errorf("west client reached the east-only endpoint of a non-global Service: %q", a)
		}
		if hasWorkload(west, uid(east, "local-east")) {
			t.Errorf("west's node proxy holds east's endpoint of the non-global Service")
		}
	})

	// Back to one endpoint per side, then the other direction.
	if err := west.SetPodReady(ctx, sides["west"].echo, true); err != nil {
		t.Fatal(err)
	}
	t.Run("east fails over to west", func(t *testing.T) {
		testkit.EventuallyErr(t, 30*time.Second, "west client back on west/echo", func() error {
			if a, err := ask(sides["west"].client, sides["west"].echoVIP); err != nil || a != "west/echo" {
				return fmt.Errorf("answer %q, %v", a, err)
			}
			return nil
		})
		pkts := failover(t, east)
		checkWAN(t, pkts, east.GatewayIP, west.GatewayIP, "west/echo")
		if _, err := west.WaitAccessLog(ctx, 0, func(a meshlab.AccessLog) bool {
			return a.Str("direction") == "inbound" && a.Str("dst.workload") == "echo-west" && a.Str("src.identity") == spiffe(ns, "client-east")
		}); err != nil {
			t.Errorf("west node proxy: no inbound access log from the east client: %v", err)
		}
		if err := east.SetPodReady(ctx, sides["east"].echo, true); err != nil {
			t.Fatal(err)
		}
		testkit.EventuallyErr(t, 30*time.Second, "east client back on east/echo", func() error {
			if a, err := ask(sides["east"].client, sides["east"].echoVIP); err != nil || a != "east/echo" {
				return fmt.Errorf("answer %q, %v", a, err)
			}
			return nil
		})
	})

	t.Run("removing the remote secret", func(t *testing.T) {
		if err := east.DeleteRemoteSecret(ctx, west); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 30*time.Second, "east's node proxy to drop west's endpoints", func() bool {
			return !hasWorkload(east, uid(west, "echo-west"))
		})
		for _, p := range []string{"echo-east", "client-east", "local-east"} {
			if !hasWorkload(east, uid(east, p)) {
				t.Errorf("east's own workload %s went with west's remote secret", p)
			}
		}
		if got := askAll(t, sides["east"].client, sides["east"].echoVIP, 3); got["east/echo"] != 3 {
			t.Errorf("east client -> echo without the remote: %v, want east/echo", got)
		}
		// West still reads east: its secret for east was not touched.
		if !hasWorkload(west, uid(east, "echo-east")) {
			t.Errorf("west's node proxy lost east's endpoint when east dropped west")
		}
	})
}

// checkWAN asserts that what crossed between the networks was only TCP
// between the client side's edge (from) and the other side's gateway (to,
// port 15008), that it carried TLS, and that no plaintext (the answer
// marker) showed.
func checkWAN(t *testing.T, pkts []testcluster.Packet, from, to netip.Addr, marker string) {
	t.Helper()
	var tcp, data int
	for _, p := range pkts {
		switch p.Proto {
		case "arp":
			continue
		case "tcp":
		default:
			t.Errorf("non-TCP packet between the networks: %s %s -> %s", p.Proto, p.Src, p.Dst)
			continue
		}
		tcp++
		okDir := p.Src.Addr() == from && p.Dst == netip.AddrPortFrom(to, mclab.GatewayPort) ||
			p.Dst.Addr() == from && p.Src == netip.AddrPortFrom(to, mclab.GatewayPort)
		if !okDir {
			t.Errorf("packet between the networks not to/from the gateway: %s -> %s", p.Src, p.Dst)
		}
		if len(p.Payload) == 0 {
			continue
		}
		data++
		// Neither the answer, nor the service the tunnels name, nor any
		// identity: TLS 1.3 encrypts even the certificates.
		for _, plain := range []string{marker, "echo.app.svc", "spiffe://"} {
			if bytes.Contains(p.Payload, []byte(plain)) {
				t.Errorf("plaintext %q seen between the networks: %s -> %s", plain, p.Src, p.Dst)
			}
		}
	}
	t.Logf("between the networks: %d packets, %d TCP, %d with data, all %s <-> %s:%d", len(pkts), tcp, data, from, to, mclab.GatewayPort)
	if tcp == 0 || data == 0 {
		t.Fatalf("no traffic between the networks captured (%d packets, %d TCP, %d with data)", len(pkts), tcp, data)
	}
	// The first data segment from the client side opens a TLS handshake
	// (ClientHello: record type 22, version 3.x).
	for _, p := range pkts {
		if p.Proto == "tcp" && p.Src.Addr() == from && len(p.Payload) > 0 {
			if len(p.Payload) < 6 || p.Payload[0] != 22 || p.Payload[1] != 3 || p.Payload[5] != 1 {
				t.Errorf("first bytes to the gateway are not a TLS ClientHello: % x", p.Payload[:min(8, len(p.Payload))])
			}
			break
		}
	}
}

// kubeClientsOf returns clients of c's API server.
func kubeClientsOf(t *testing.T, c *mclab.Cluster) *kube.Clients {
	t.Helper()
	cl, err := kube.NewClients(c.API.Config())
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
