package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Issue 7's end-to-end suite: the mesh built by meshlab from the real
// binaries (ztunnel-cp in local mode, and per node ztunnel-cni with its
// installed plugin and ztunnel), with examples/ loaded, plus the matrix
// pods below. Pods are created through CNI; the mesh decides capture.
//
//	namespace matrix (ambient):  mx-client (node0), mx-server-0 (node0), mx-server-1 (node1)
//	namespace matrix-plain:      px-client (node0), px-server-0 (node0), px-server-1 (node1)
//
// Every server has a Service of its own name (80 → 8080, echo).
func TestMesh(t *testing.T) {
	roottest.Require(t)
	m, err := meshlab.Start(t, meshlab.Options{Examples: []string{"../examples"}})
	if err != nil {
		t.Fatal(err)
	}
	// After Start, which builds the binaries (over a minute on a loaded
	// machine): the bound is for the pods and the matrix only.
	ctx := ctxT(t, 60*time.Second)
	if err := m.AddNamespace("matrix", ambientNS); err != nil {
		t.Fatal(err)
	}
	var ips []netip.Addr
	for _, p := range []struct {
		ns, name string
		node     int
		server   bool
	}{
		{"matrix", "mx-client", 0, false},
		{"matrix", "mx-server-0", 0, true},
		{"matrix", "mx-server-1", 1, true},
		{"matrix-plain", "px-client", 0, false},
		{"matrix-plain", "px-server-0", 0, true},
		{"matrix-plain", "px-server-1", 1, true},
	} {
		spec := testcluster.PodSpec{Name: p.name, Namespace: p.ns, ServiceAccount: p.name, Labels: map[string]string{"app": p.name}}
		if p.server {
			spec.Containers = []kube.Container{{Name: "app", Ports: []kube.ContainerPort{{Name: "tcp-echo", Port: 8080}}}}
			if _, err := m.AddService(testcluster.ServiceSpec{Name: p.name, Namespace: p.ns, Selector: spec.Labels,
				Ports: []kube.ServicePort{{Name: "tcp-echo", Port: 80, TargetPort: 8080}}}); err != nil {
				t.Fatal(err)
			}
		}
		pod, err := m.AddPod(ctx, p.node, spec)
		if err != nil {
			t.Fatal(err)
		}
		ips = append(ips, pod.IP)
	}
	if err := m.SyncKubeProxy(); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, ips...); err != nil {
		t.Fatal(err)
	}

	t.Run("matrix", func(t *testing.T) { testMeshMatrix(t, m) })
	t.Run("STRICT denies plaintext", func(t *testing.T) { testMeshStrict(t, m) })
	t.Run("ServiceEntry via DNS and TCP", func(t *testing.T) { testMeshServiceEntry(t, m) })
	t.Run("waypoint", func(t *testing.T) { testMeshWaypoint(t, m) })
	t.Run("start-up code released, traffic still flows", func(t *testing.T) { testMeshStartupCode(t, m) })
	// Last: it changes policy for mx-server-1.
	t.Run("policy applied at runtime closes an open connection", func(t *testing.T) { testMeshRevoke(t, m) })
}

// testMeshStartupCode: each node proxy gives its executable's pages back
// once it is ready (RELEASE_STARTUP_CODE, on by default; meshlab gives
// each node its own copy of the binary, as separate machines would have),
// and a captured cross-node connection still works afterwards, its code
// read back from the file. The file's pages must leave the page cache
// too (at least half of what left the process; the rest of the node
// proxy's threads read some back meanwhile): freed, not merely unmapped.
func testMeshStartupCode(t *testing.T, m *meshlab.Mesh) {
	ctx := ctxT(t, 30*time.Second)
	var fs unix.Statfs_t
	if err := unix.Statfs(m.Nodes[0].Dir, &fs); err == nil && fs.Type == unix.TMPFS_MAGIC {
		// tmpfs pages are the file itself: without swap there is nowhere
		// to page them out to.
		t.Skipf("%s is on tmpfs", m.Nodes[0].Dir)
	}
	for i := range m.Nodes {
		p := m.Nodes[i].Proxy
		if err := p.WaitLog(ctx, `"startup code released"`); err != nil {
			t.Fatalf("node%d: %v", i, err)
		}
		var line struct {
			Resident      uint64 `json:"resident_kib"`
			ResidentAfter uint64 `json:"resident_after_kib"`
			Cached        uint64 `json:"cached_kib"`
			CachedAfter   uint64 `json:"cached_after_kib"`
		}
		sc := bufio.NewScanner(bytes.NewReader(p.Log()))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if bytes.Contains(sc.Bytes(), []byte(`"startup code released"`)) {
				if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
					t.Fatalf("node%d: %q: %v", i, sc.Bytes(), err)
				}
			}
		}
		t.Logf("node%d: executable resident %d → %d KiB, page cache %d → %d KiB", i, line.Resident, line.ResidentAfter, line.Cached, line.CachedAfter)
		// Half after, as TestReleaseStartupCode: what the proxy runs while
		// it measures comes back first (1.1-3.0 of 14.2 MiB in quiet runs,
		// more under a loaded CI), and a release that did nothing would
		// leave all of it.
		if line.Resident < 4<<10 || line.ResidentAfter > line.Resident/2 {
			t.Errorf("node%d: resident %d → %d KiB, want at least 4 MiB before and half of it after", i, line.Resident, line.ResidentAfter)
		}
		if freed, left := line.Cached-min(line.CachedAfter, line.Cached), line.Resident-line.ResidentAfter; freed < left/2 {
			t.Errorf("node%d: %d KiB left the process but %d KiB the page cache: unmapped, not freed", i, left, freed)
		}
	}
	want := payload(4321)
	dst := netip.AddrPortFrom(m.Pod("matrix", "mx-server-1").IP, 8080)
	got, err := meshlab.RoundTrip(ctx, m.Pod("matrix", "mx-client"), dst, want)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("mx-client → %s after the release: got %d of %d bytes, err %v", dst, len(got), len(want), err)
	}
}

func spiffe(ns, sa string) string { return "spiffe://cluster.local/ns/" + ns + "/sa/" + sa }

// testMeshMatrix is the client-mode × server-mode matrix: each
// row sends a payload of its own size (which is how its access-log lines
// are found), expects it echoed intact, and checks the path the mesh took:
// an outbound line at the client's node proxy exactly when the client is
// captured, an inbound line at the server's exactly when the server is,
// mTLS identities on both exactly when both are, and the destination's
// metrics.
func testMeshMatrix(t *testing.T, m *meshlab.Mesh) {
	type row struct {
		clientCaptured, serverCaptured, crossNode, viaVIP bool
	}
	var rows []row
	for _, cc := range []bool{true, false} {
		for _, sc := range []bool{true, false} {
			for _, cross := range []bool{false, true} {
				for _, vip := range []bool{false, true} {
					rows = append(rows, row{cc, sc, cross, vip})
				}
			}
		}
	}
	mode := map[bool]string{true: "captured", false: "uncaptured"}
	for i, r := range rows {
		name := fmt.Sprintf("%s client to %s server, %s, via %s", mode[r.clientCaptured], mode[r.serverCaptured],
			map[bool]string{true: "cross node", false: "same node"}[r.crossNode], map[bool]string{true: "service VIP", false: "pod IP"}[r.viaVIP])
		t.Run(name, func(t *testing.T) {
			ctx := ctxT(t, 20*time.Second)
			client := m.Pod("matrix-plain", "px-client")
			if r.clientCaptured {
				client = m.Pod("matrix", "mx-client")
			}
			serverNS, serverName := "matrix-plain", "px-server-0"
			if r.serverCaptured {
				serverNS, serverName = "matrix", "mx-server-0"
			}
			if r.crossNode {
				serverName = serverName[:len(serverName)-1] + "1"
			}
			server := m.Pod(serverNS, serverName)
			dst := netip.AddrPortFrom(server.IP, 8080)
			if r.viaVIP {
				dst = netip.AddrPortFrom(m.Service(serverNS, serverName), 80)
			}
			secPolicy := map[bool]string{true: "mutual_tls", false: "unknown"}[r.clientCaptured]
			metricLabels := map[string]string{"reporter": "destination", "destination_workload": serverName, "connection_security_policy": secPolicy}
			before := 0.0
			if r.serverCaptured {
				before = scrape(t, m, server.Node.Index, "istio_tcp_connections_opened_total", metricLabels)
			}

			size := 30000 + 997*i // unique per row
			want := payload(size)
			got, err := meshlab.RoundTrip(ctx, client, dst, want)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s → %s: got %d of %d bytes, err %v", client.Name, dst, len(got), size, err)
			}
			bySize := func(a meshlab.AccessLog) bool {
				return a.Int("bytes_sent") == int64(size) || a.Int("bytes_recv") == int64(size)
			}
			wantMTLS := r.clientCaptured && r.serverCaptured

			if r.clientCaptured {
				// The proxy's fields, as Istio's ztunnel logs them: dst.addr
				// is where it connected (the pod's 15008 for HBONE),
				// dst.hbone_addr the CONNECT authority.
				out, err := m.WaitAccessLog(ctx, client.Node.Index, func(a meshlab.AccessLog) bool {
					return a.Str("direction") == "outbound" && a.Str("src.workload") == "mx-client" && bySize(a)
				})
				if err != nil {
					t.Fatal(err)
				}
				wantSvc := ""
				if r.viaVIP {
					wantSvc = serverName + "." + serverNS + ".svc.cluster.local"
				}
				want := map[string]string{
					"reason": "", "dst.workload": serverName, "dst.service": wantSvc,
					"dst.addr": netip.AddrPortFrom(server.IP, 8080).String(), "dst.hbone_addr": "", "dst.identity": "", "src.identity": "",
				}
				if wantMTLS {
					want["dst.addr"] = netip.AddrPortFrom(server.IP, 15008).String()
					want["dst.hbone_addr"] = netip.AddrPortFrom(server.IP, 8080).String()
					want["dst.identity"] = spiffe("matrix", serverName)
					want["src.identity"] = spiffe("matrix", "mx-client")
				}
				for k, v := range want {
					if out.Str(k) != v {
						t.Errorf("outbound %s = %q, want %q (mTLS %v)", k, out.Str(k), v, wantMTLS)
					}
				}
			}
			if r.serverCaptured {
				in, err := m.WaitAccessLog(ctx, server.Node.Index, func(a meshlab.AccessLog) bool {
					return a.Str("direction") == "inbound" && a.Str("dst.workload") == serverName && bySize(a)
				})
				if err != nil {
					t.Fatal(err)
				}
				if in.Str("reason") != "" || !strings.HasPrefix(in.Str("src.addr"), client.IP.String()+":") {
					t.Errorf("inbound line: reason %q, src.addr %q (want the client's IP kept)", in.Str("reason"), in.Str("src.addr"))
				}
				if gotID, wantID := in.Str("src.identity"), map[bool]string{true: spiffe("matrix", "mx-client"), false: ""}[wantMTLS]; gotID != wantID {
					t.Errorf("inbound src.identity %q, want %q (mTLS %v)", gotID, wantID, wantMTLS)
				}
				if after := scrape(t, m, server.Node.Index, "istio_tcp_connections_opened_total", metricLabels); after != before+1 {
					t.Errorf("istio_tcp_connections_opened_total%v went %v → %v, want +1", metricLabels, before, after)
				}
			}
			if !r.clientCaptured && !r.serverCaptured {
				// Neither end is in the mesh: no node proxy saw the bytes.
				for i := range m.Nodes {
					for _, a := range m.AccessLogs(i) {
						if bySize(a) {
							t.Errorf("node%d proxy logged a connection between two pods outside the mesh: %v", i, a)
						}
					}
				}
			}
		})
	}
}

func scrape(t *testing.T, m *meshlab.Mesh, node int, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := m.Metrics(ctxT(t, 5*time.Second), node)
	if err != nil {
		t.Fatal(err)
	}
	return meshlab.Counter(mfs, name, labels)
}

// testMeshStrict: the examples' namespace demo is STRICT, so plaintext from
// a pod outside the mesh is refused at the server's node proxy, naming the
// policy; the matrix namespace (PERMISSIVE, the default) accepted the same
// kind of connection above.
func testMeshStrict(t *testing.T, m *meshlab.Mesh) {
	ctx := ctxT(t, 20*time.Second)
	client, server := m.Pod("matrix-plain", "px-client"), m.Pod("demo", "server")
	dst := netip.AddrPortFrom(server.IP, 8080)
	got, err := meshlab.RoundTrip(ctx, client, dst, []byte("plaintext"))
	if err == nil && len(got) > 0 {
		t.Fatalf("plaintext to a STRICT pod was answered: %q", got)
	}
	a, err := m.WaitAccessLog(ctx, server.Node.Index, func(a meshlab.AccessLog) bool {
		return a.Str("direction") == "inbound" && a.Str("dst.workload") == "server" &&
			strings.HasPrefix(a.Str("src.addr"), client.IP.String()+":")
	})
	if err != nil {
		t.Fatal(err)
	}
	if a.Str("reason") != "policy_denied" || !strings.Contains(a.Str("error"), "istio_converted_static_strict") {
		t.Errorf("STRICT refusal logged reason %q, error %q", a.Str("reason"), a.Str("error"))
	}
}

// testMeshServiceEntry: a captured pod's DNS query for the ServiceEntry
// host is answered by its node proxy with the auto-allocated address, and
// TCP to that address reaches the selected pod; the same query from a pod
// outside the mesh reaches the cluster DNS server, which does not know the
// host.
func testMeshServiceEntry(t *testing.T, m *meshlab.Mesh) {
	ctx := ctxT(t, 20*time.Second)
	clusterDNS := netip.AddrPortFrom(m.DNSPod.IP, 53)
	client := m.Pod("matrix", "mx-client")
	for _, proto := range []string{"udp", "tcp"} {
		r, err := meshlab.DNSQuery(ctx, client, proto, clusterDNS, "api.legacy.example", dns.TypeA)
		if err != nil {
			t.Fatal(err)
		}
		ip, err := meshlab.FirstA(r)
		if err != nil || !netip.MustParsePrefix("240.240.0.0/16").Contains(ip) {
			t.Fatalf("%s: api.legacy.example = %v (%v), want an auto-allocated 240.240/16 address", proto, ip, err)
		}
		const size = 7777
		want := payload(size)
		got, err := meshlab.RoundTrip(ctx, client, netip.AddrPortFrom(ip, 80), want)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("TCP to %s:80: got %d of %d bytes, err %v", ip, len(got), size, err)
		}
	}
	if _, err := m.WaitAccessLog(ctx, client.Node.Index, meshlab.Fields(map[string]string{
		"direction": "outbound", "dst.service": "api.legacy.example", "dst.workload": "legacy-api",
	})); err != nil {
		t.Fatal(err)
	}
	r, err := meshlab.DNSQuery(ctx, m.Pod("matrix-plain", "px-client"), "udp", clusterDNS, "api.legacy.example", dns.TypeA)
	if err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeNameError {
		t.Errorf("uncaptured pod's query answered %s %v; want NXDOMAIN from the cluster DNS server", dns.RcodeToString[r.Rcode], r.Answer)
	}
}

// testMeshWaypoint: traffic to the waypoint-bound service goes to the
// waypoint (HBONE to its pod, its identity) with the original authority
// (VIP:port), and the waypoint's re-originated HBONE reaches the endpoint
// with the waypoint's identity.
func testMeshWaypoint(t *testing.T, m *meshlab.Mesh) {
	ctx := ctxT(t, 30*time.Second)
	wp, err := m.StartWaypoint(ctx, "demo", "waypoint")
	if err != nil {
		t.Fatal(err)
	}
	client, ratings, wpPod := m.Pod("demo", "client"), m.Pod("demo", "ratings"), m.Pod("demo", "waypoint")
	vip := netip.AddrPortFrom(m.Service("demo", "ratings"), 80)
	const size = 12345
	want := payload(size)
	got, err := meshlab.RoundTrip(ctx, client, vip, want)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("via waypoint: got %d of %d bytes, err %v", len(got), size, err)
	}
	out, err := m.WaitAccessLog(ctx, client.Node.Index, func(a meshlab.AccessLog) bool {
		return a.Str("direction") == "outbound" && a.Str("dst.service") == "ratings.demo.svc.cluster.local" &&
			a.Int("bytes_sent")+a.Int("bytes_recv") == 2*size
	})
	if err != nil {
		t.Fatal(err)
	}
	if out.Str("dst.addr") != netip.AddrPortFrom(wpPod.IP, 15008).String() || out.Str("dst.hbone_addr") != vip.String() ||
		out.Str("dst.identity") != spiffe("demo", "waypoint") {
		t.Errorf("outbound went to %q, authority %q, as %q; want the waypoint %s:15008, authority %s, as %s",
			out.Str("dst.addr"), out.Str("dst.hbone_addr"), out.Str("dst.identity"), wpPod.IP, vip, spiffe("demo", "waypoint"))
	}
	// The waypoint (cmd/waypoint) accepted the CONNECT from the client's
	// identity; the port is tcp-echo, so it went the L4 way.
	if _, err := wp.WaitAccessLog(ctx, func(a meshlab.AccessLog) bool {
		return a.Str("dst.addr") == vip.String() && a.Str("src.identity") == spiffe("demo", "client") &&
			a.Str("code") == "200" && a.Str("protocol") == "tcp"
	}); err != nil {
		t.Error(err)
	}
	if _, err := m.WaitAccessLog(ctx, ratings.Node.Index, func(a meshlab.AccessLog) bool {
		return a.Str("direction") == "inbound" && a.Str("dst.workload") == "ratings" &&
			a.Str("src.identity") == spiffe("demo", "waypoint") && a.Int("bytes_sent")+a.Int("bytes_recv") == 2*size
	}); err != nil {
		t.Error(err)
	}
}

// testMeshRevoke: an open mTLS connection that a newly applied DENY policy
// no longer allows is closed by the server's node proxy, and logged as
// revoked; removing the policy lets new connections through again.
func testMeshRevoke(t *testing.T, m *meshlab.Mesh) {
	ctx := ctxT(t, 30*time.Second)
	client, server := m.Pod("matrix", "mx-client"), m.Pod("matrix", "mx-server-1")
	dst := netip.AddrPortFrom(server.IP, 8080)
	c, err := client.Dial(ctx, "tcp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 5)
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo before the policy: %q, %v", buf, err)
	}
	policy := `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: deny-mx-client
  namespace: matrix
spec:
  selector:
    matchLabels: {app: mx-server-1}
  action: DENY
  rules:
  - from:
    - source:
        principals: [cluster.local/ns/matrix/sa/mx-client]
`
	if err := m.Apply("e2e-deny-mx-client", []byte(policy)); err != nil {
		t.Fatal(err)
	}
	// The proxy closes the connection: the read ends (EOF or reset), well
	// before the deadline.
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("connection still open after the DENY policy (read %d bytes)", n)
	} else if strings.Contains(err.Error(), "timeout") {
		t.Fatalf("connection not closed after the DENY policy: %v", err)
	}
	// The revocation line names the policy that revoked it.
	if _, err := m.WaitAccessLog(ctx, server.Node.Index, func(a meshlab.AccessLog) bool {
		return a.Str("direction") == "inbound" && a.Str("dst.workload") == "mx-server-1" && a.Str("reason") == "revoked" &&
			strings.HasSuffix(a.Str("error"), "denied by matrix/deny-mx-client") &&
			a.Str("src.identity") == spiffe("matrix", "mx-client") && a.Int("bytes_recv") == 5
	}); err != nil {
		t.Fatal(err)
	}
	// New connections are refused, naming the policy.
	got, err := meshlab.RoundTrip(ctx, client, dst, []byte("refused?"))
	if err == nil && len(got) > 0 {
		t.Fatalf("new connection answered %q under the DENY policy", got)
	}
	if _, err := m.WaitAccessLog(ctx, server.Node.Index, func(a meshlab.AccessLog) bool {
		return a.Str("dst.workload") == "mx-server-1" && a.Str("reason") == "policy_denied" &&
			strings.HasSuffix(a.Str("error"), "denied by matrix/deny-mx-client")
	}); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("e2e-deny-mx-client"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitTimeout, "the connection allowed again after removing the policy", func() bool {
		got, err := meshlab.RoundTrip(ctxT(t, 5*time.Second), client, dst, []byte("again"))
		return err == nil && string(got) == "again"
	})
}
