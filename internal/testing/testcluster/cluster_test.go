package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// echo serves ln until it is closed: each connection gets back what it sent,
// prefixed with who answered.
func echo(ln net.Listener, who string) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			data, _ := io.ReadAll(conn)
			fmt.Fprintf(conn, "%s:%s", who, data)
		}()
	}
}

// roundTrip sends msg from src to dst:port and returns the reply.
func roundTrip(ctx context.Context, src *Pod, dst netip.AddrPort, msg string) (string, error) {
	conn, err := src.Dial(ctx, "tcp", dst.String())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(msg)); err != nil {
		return "", err
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return "", err
	}
	reply, err := io.ReadAll(conn)
	return string(reply), err
}

func rootLinks(t *testing.T) string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	return strings.Join(names, ",")
}

func TestCluster(t *testing.T) {
	// Gate here too: the subtest's skip would leave c nil for the checks below.
	roottest.Require(t)
	linksBefore := rootLinks(t)
	var c *Cluster
	t.Run("cluster", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c = New(t, Options{Nodes: 2})
		if err := c.AddNamespace("demo", map[string]string{"istio.io/dataplane-mode": "ambient"}); err != nil {
			t.Fatal(err)
		}
		var pods [2][2]*Pod
		for n := 0; n < 2; n++ {
			for j := 0; j < 2; j++ {
				p, err := c.Node(n).AddPod(ctx, PodSpec{
					Name: fmt.Sprintf("pod-%d-%d", n, j), Namespace: "demo",
					Labels:         map[string]string{"app": "echo"},
					ServiceAccount: "echo",
				})
				if err != nil {
					t.Fatal(err)
				}
				if want := netip.AddrFrom4([4]byte{10, 31, byte(n), byte(10 + j)}); p.IP != want {
					t.Errorf("pod %s IP = %s, want %s", p.Name, p.IP, want)
				}
				pods[n][j] = p
			}
		}
		// The address inside the pod is the planned one.
		out, err := pods[1][1].Exec(ctx, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if err != nil || !strings.Contains(string(out), "10.31.1.11/24") {
			t.Errorf("pod-1-1 eth0: %s (%v)", out, err)
		}

		for n := 0; n < 2; n++ {
			for j := 0; j < 2; j++ {
				p := pods[n][j]
				ln, err := p.Listen(":8080")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				go echo(ln, p.Name)
			}
		}
		capture, err := c.CaptureUnderlay(ctx, "tcp port 8080")
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name     string
			src, dst *Pod
		}{
			{"same node", pods[0][0], pods[0][1]},
			{"cross node", pods[0][0], pods[1][1]},
			{"cross node back", pods[1][0], pods[0][1]},
		} {
			msg := strings.Repeat("x", 100000) + tc.name
			reply, err := roundTrip(ctx, tc.src, netip.AddrPortFrom(tc.dst.IP, 8080), msg)
			if err != nil || reply != tc.dst.Name+":"+msg {
				t.Errorf("%s: %s -> %s: got %d bytes %q... (%v)", tc.name, tc.src.Name, tc.dst.Name, len(reply), reply[:min(len(reply), 20)], err)
			}
		}

		pkts, err := capture.Stop()
		if err != nil {
			t.Fatal(err)
		}
		checkCapture(t, pkts, pods[0][0], pods[0][1], pods[1][1])

		// The machine's own addresses are not reachable from a pod: the node
		// has no route out of the topology, and answers "unreachable".
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			pfx, err := netip.ParsePrefix(a.String())
			if err != nil || pfx.Addr().IsLoopback() || !pfx.Addr().Is4() {
				continue
			}
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			conn, err := pods[0][0].Dial(dctx, "tcp", netip.AddrPortFrom(pfx.Addr(), 22).String())
			dcancel()
			if err == nil {
				conn.Close()
				t.Errorf("pod reached the root namespace's %s", pfx.Addr())
			} else if !errors.Is(err, syscall.ENETUNREACH) && !errors.Is(err, syscall.EHOSTUNREACH) {
				t.Errorf("dial %s from a pod: %v, want network/host unreachable", pfx.Addr(), err)
			}
		}

		// A host-network pod runs in the node namespace with the node's IP.
		hp, err := c.Node(1).AddPod(ctx, PodSpec{Name: "agent", Namespace: "kube-system", HostNetwork: true})
		if err != nil {
			t.Fatal(err)
		}
		if hp.IP != c.Node(1).UnderlayIP || hp.NetNSName() != c.Node(1).NetNSName() {
			t.Errorf("host-network pod: IP %s netns %s", hp.IP, hp.NetNSName())
		}
		if reply, err := roundTrip(ctx, hp, netip.AddrPortFrom(pods[0][1].IP, 8080), "from node"); err != nil || reply != "pod-0-1:from node" {
			t.Errorf("node1 -> pod-0-1: %q (%v)", reply, err)
		}

		if _, err := c.AddService(ServiceSpec{
			Name: "echo", Namespace: "demo", Selector: map[string]string{"app": "echo"},
			Ports: []kube.ServicePort{{Name: "tcp", Port: 80, TargetPort: 8080}},
		}); err != nil {
			t.Fatal(err)
		}
		checkConfig(t, c)
	})
	// After the subtest's cleanup: nothing of it is left, and the root
	// namespace has the links it had before.
	if left, err := listNetNS(nsPrefix(c.ID())); err != nil || len(left) != 0 {
		t.Errorf("namespaces left after cleanup: %v (%v)", left, err)
	}
	if after := rootLinks(t); after != linksBefore {
		t.Errorf("root namespace links changed: before %s, after %s", linksBefore, after)
	}
}

// checkCapture checks what crossed the underlay while the round trips ran:
// the cross-node connection in full (SYN, the reply bytes), and nothing of
// the same-node one.
func checkCapture(t *testing.T, pkts []Packet, client, sameNode, crossNode *Pod) {
	t.Helper()
	var syn bool
	var fromServer []byte
	// Under load a segment may be retransmitted and captured twice: keep
	// each sequence range once (segments of one direction are otherwise in
	// order on this single bridge).
	var next uint32
	started := false
	for _, p := range pkts {
		if p.Proto != "tcp" {
			t.Errorf("filter 'tcp port 8080' let through %s %s -> %s", p.Proto, p.Src, p.Dst)
		}
		if p.Src.Addr() == client.IP && p.Dst == netip.AddrPortFrom(crossNode.IP, 8080) && p.TCPFlags&TCPSyn != 0 {
			syn = true
		}
		if p.Src == netip.AddrPortFrom(crossNode.IP, 8080) && p.Dst.Addr() == client.IP && len(p.Payload) > 0 {
			if !started {
				next, started = p.TCPSeq, true
			}
			// Keep only the part of the segment past what we already have.
			if d := int32(next - p.TCPSeq); d >= 0 && int(d) < len(p.Payload) {
				fromServer = append(fromServer, p.Payload[d:]...)
				next = p.TCPSeq + uint32(len(p.Payload))
			}
		}
		if a, b := p.Src.Addr(), p.Dst.Addr(); a == client.IP && b == sameNode.IP || a == sameNode.IP && b == client.IP {
			t.Errorf("same-node traffic crossed the underlay: %s -> %s", p.Src, p.Dst)
		}
	}
	if !syn {
		t.Errorf("no SYN %s -> %s:8080 among %d captured packets", client.IP, crossNode.IP, len(pkts))
	}
	if want := crossNode.Name + ":" + strings.Repeat("x", 100000) + "cross node"; string(fromServer) != want {
		t.Errorf("captured %d reply bytes, want the %d the server sent", len(fromServer), len(want))
	}
}

// checkConfig decodes the YAML the cluster wrote into the real API types.
func checkConfig(t *testing.T, c *Cluster) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(c.ConfigDir(), "pod.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ips := map[string]string{}
	for _, doc := range bytes.Split(data, []byte("---\n")) {
		var p corev1.Pod
		if err := yaml.UnmarshalStrict(doc, &p); err != nil {
			t.Fatalf("pod.yaml: %v", err)
		}
		if p.Status.Phase != corev1.PodRunning || p.UID == "" || p.Spec.NodeName == "" {
			t.Errorf("pod %s: phase %s uid %q node %q", p.Name, p.Status.Phase, p.UID, p.Spec.NodeName)
		}
		ips[p.Namespace+"/"+p.Name] = p.Status.PodIP
	}
	if len(ips) != 5 || ips["demo/pod-1-0"] != "10.31.1.10" || ips["kube-system/agent"] != "10.30.0.11" {
		t.Errorf("pod IPs in YAML: %v", ips)
	}
	var svc corev1.Service
	if data, err = os.ReadFile(filepath.Join(c.ConfigDir(), "service.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != "10.32.0.10" {
		t.Errorf("service ClusterIP %s, want 10.32.0.10", svc.Spec.ClusterIP)
	}
	var es discoveryv1.EndpointSlice
	if data, err = os.ReadFile(filepath.Join(c.ConfigDir(), "endpointslice.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &es); err != nil {
		t.Fatal(err)
	}
	if len(es.Endpoints) != 4 || *es.Ports[0].Port != 8080 {
		t.Errorf("endpointslice: %d endpoints, ports %v", len(es.Endpoints), es.Ports)
	}
	var ns corev1.Namespace
	if data, err = os.ReadFile(filepath.Join(c.ConfigDir(), "namespace.yaml")); err != nil {
		t.Fatal(err)
	}
	docs := bytes.Split(data, []byte("---\n"))
	if err := yaml.UnmarshalStrict(docs[0], &ns); err != nil || ns.Name != "demo" || ns.Labels["istio.io/dataplane-mode"] != "ambient" {
		t.Errorf("first namespace %s labels %v (%v)", ns.Name, ns.Labels, err)
	}
}

// TestCNIAddFailsThenRetry plays "ADD fails while the agent is down, the
// runtime retries later", and checks what the chained plugin receives.
func TestCNIAddFailsThenRetry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := New(t, Options{
		PluginDirs: []string{fakePluginDir(t)},
		ExtraPlugins: func(n *Node) []map[string]any {
			return []map[string]any{{"type": fakePluginName, "gate": filepath.Join(n.Dir, "agent-up")}}
		},
	})
	gate := filepath.Join(c.Node(0).Dir, "agent-up")

	// An uncaptured pod never meets the extra plugin.
	plain, err := c.Node(0).AddPod(ctx, PodSpec{Name: "plain", Uncaptured: true})
	if err != nil || !plain.Running() {
		t.Fatalf("uncaptured pod with the plugin failing: %v", err)
	}

	p, err := c.Node(0).AddPod(ctx, PodSpec{Name: "app", Namespace: "demo"})
	var ce *CNIError
	if !errors.As(err, &ce) || ce.Op != "ADD" || !strings.Contains(ce.Output, "fake agent unavailable") {
		t.Fatalf("AddPod with the agent down: %v, want a CNI ADD error from the plugin", err)
	}
	if p == nil || p.Running() {
		t.Fatalf("pod after failed ADD: %+v, want pending", p)
	}
	if _, err := os.Stat(p.NetNSPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed sandbox's namespace still exists (%v)", err)
	}
	if _, err := p.Dial(ctx, "tcp", "10.31.0.1:1"); !errors.Is(err, ErrNoNetNS) {
		t.Errorf("Dial in a pending pod: %v, want ErrNoNetNS", err)
	}
	if phase := podPhase(t, c, "demo", "app"); phase != corev1.PodPending {
		t.Errorf("YAML phase %q, want Pending", phase)
	}

	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.Retry(ctx); err != nil {
		t.Fatalf("Retry with the agent up: %v", err)
	}
	if !p.Running() || podPhase(t, c, "demo", "app") != corev1.PodRunning {
		t.Errorf("pod not running after retry")
	}
	args, err := os.ReadFile(gate + ".args")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"K8S_POD_NAMESPACE=demo", "K8S_POD_NAME=app", "K8S_POD_UID=" + p.UID, p.NetNSPath()} {
		if !strings.Contains(string(args), want) {
			t.Errorf("plugin saw %q, missing %q", args, want)
		}
	}
	// The retried pod has its planned address and can talk to its neighbour.
	ln, err := plain.Listen(":9000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echo(ln, "plain")
	if reply, err := roundTrip(ctx, p, netip.AddrPortFrom(plain.IP, 9000), "hi"); err != nil || reply != "plain:hi" {
		t.Errorf("app -> plain: %q (%v)", reply, err)
	}

	if err := p.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.NetNSPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("deleted pod's namespace still exists (%v)", err)
	}
	if phase := podPhase(t, c, "demo", "app"); phase != "" {
		t.Errorf("deleted pod still in YAML (phase %q)", phase)
	}

	// The next pod gets the deleted one's address (as a node's IPAM would)
	// and a working sandbox.
	next, err := c.Node(0).AddPod(ctx, PodSpec{Name: "app-2", Namespace: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	if next.IP != p.IP || next.UID == p.UID {
		t.Errorf("pod after a deletion: %s (UID %s), want the deleted pod's %s with a UID of its own", next.IP, next.UID, p.IP)
	}
	if reply, err := roundTrip(ctx, next, netip.AddrPortFrom(plain.IP, 9000), "again"); err != nil || reply != "plain:again" {
		t.Errorf("reused address -> plain: %q (%v)", reply, err)
	}
}

// podPhase returns the phase of namespace/name in the cluster's pod.yaml, ""
// when absent.
func podPhase(t *testing.T, c *Cluster, namespace, name string) corev1.PodPhase {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(c.ConfigDir(), "pod.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(data, []byte("---\n")) {
		var p corev1.Pod
		if err := yaml.UnmarshalStrict(doc, &p); err != nil {
			t.Fatal(err)
		}
		if p.Namespace == namespace && p.Name == name {
			return p.Status.Phase
		}
	}
	return ""
}

func TestProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := New(t, Options{})
	p, err := c.Node(0).AddPod(ctx, PodSpec{Name: "p"})
	if err != nil {
		t.Fatal(err)
	}
	proc, err := p.Start(Process{Name: "server", Path: "/bin/sh", Args: []string{"-c", "echo ready $GREETING; exec sleep 100"},
		Env: []string{"GREETING=hello"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.WaitLog(ctx, "ready hello"); err != nil {
		t.Fatal(err)
	}
	var want, got syscall.Stat_t
	if err := syscall.Stat(p.NetNSPath(), &want); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", proc.PID()), &got); err != nil {
		t.Fatal(err)
	}
	if got.Ino != want.Ino || got.Dev != want.Dev {
		t.Errorf("process runs in netns inode %d, want the pod's %d", got.Ino, want.Ino)
	}
	if err := proc.Stop(); err != nil {
		t.Errorf("Stop of a process that exits on SIGTERM: %v", err)
	}
	select {
	case <-proc.Done():
	default:
		t.Error("Done not closed after Stop")
	}

	stubborn, err := c.Node(0).Start(Process{Name: "stubborn", Path: "/bin/sh", StopTimeout: 200 * time.Millisecond,
		Args: []string{"-c", `trap "" TERM; echo ready; while :; do sleep 1; done`}})
	if err != nil {
		t.Fatal(err)
	}
	if err := stubborn.WaitLog(ctx, "ready"); err != nil {
		t.Fatal(err)
	}
	if err := stubborn.Stop(); err == nil || !strings.Contains(err.Error(), "ignored SIGTERM") {
		t.Errorf("Stop of a process ignoring SIGTERM: %v, want 'ignored SIGTERM'", err)
	}

	out, err := p.Exec(ctx, "sh", "-c", "exit 3")
	if err == nil {
		t.Errorf("Exec of a failing command: nil error, output %q", out)
	}
}

// TestRerunAfterCrash leaves a whole cluster behind (no cleanup, a process
// still running in a pod), then builds the same test's cluster again.
func TestRerunAfterCrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	crashed := newCluster(t, Options{Nodes: 2}, false)
	old, err := crashed.Node(1).AddPod(ctx, PodSpec{Name: "p"})
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := old.Start(Process{Path: "/bin/sleep", Args: []string{"100"}})
	if err != nil {
		t.Fatal(err)
	}
	crashed.underlay.close() // as if the process had died: no handles held
	for _, n := range crashed.nodes {
		n.close()
	}
	old.close()

	c := New(t, Options{Nodes: 2})
	select {
	case <-orphan.Done():
	case <-ctx.Done():
		t.Fatal("the crashed run's process still runs in its leftover namespace")
	}
	p0, err := c.Node(0).AddPod(ctx, PodSpec{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	p1, err := c.Node(1).AddPod(ctx, PodSpec{Name: "p"}) // same namespace name as the leftover pod
	if err != nil {
		t.Fatal(err)
	}
	ln, err := p1.Listen(":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echo(ln, "p")
	if reply, err := roundTrip(ctx, p0, netip.AddrPortFrom(p1.IP, 7000), "again"); err != nil || reply != "p:again" {
		t.Errorf("a -> p in the rebuilt cluster: %q (%v)", reply, err)
	}
}

// TestProgram builds a cluster the way bench/ and the demo do, without a
// testing.T, and checks that Close removes everything.
func TestProgram(t *testing.T) {
	roottest.Require(t)
	var log bytes.Buffer
	prog := testkit.NewProgram(t.Name()+"-program", &log)
	c := New(prog, Options{})
	p, err := c.Node(0).AddPod(context.Background(), PodSpec{Name: "p"})
	if err != nil {
		prog.Close()
		t.Fatal(err)
	}
	prefix, state := nsPrefix(c.ID()), c.StateDir()
	if left, _ := listNetNS(prefix); len(left) != 3 {
		t.Errorf("namespaces while running: %v, want underlay, node and pod", left)
	}
	if _, err := p.Exec(context.Background(), "true"); err != nil {
		t.Error(err)
	}
	prog.Close()
	if left, err := listNetNS(prefix); err != nil || len(left) != 0 {
		t.Errorf("namespaces after Close: %v (%v)", left, err)
	}
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state dir %s survives Close (%v)", state, err)
	}
	if prog.Failed() || !strings.Contains(log.String(), "nodes=1") {
		t.Errorf("program failed=%v, log:\n%s", prog.Failed(), log.String())
	}
}
