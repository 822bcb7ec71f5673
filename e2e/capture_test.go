package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// Issue 4's end-to-end tests: real CNI ADDs through ztunnel-cni, the node
// agent as a process in the node's namespace, and a stand-in node proxy (a
// ZDS client opening the capture listeners in each pod it is given).

func proxied(port int, dst netip.AddrPort) string { return fmt.Sprintf("proxy %d %s", port, dst) }

func direct(name string, port int) string { return fmt.Sprintf("direct %s:%d", name, port) }

// TestCaptureTraffic installs the plugin with the agent's installer, then
// shows which traffic of which pod reaches the node proxy: enrollment by
// namespace label and opt-out, DNS capture on by default and off by
// annotation, excluded ports and IP ranges (DNS included), inbound capture,
// kubelet probes from the node, and uninstall on exit, which releases the
// captured pods.
func TestCaptureTraffic(t *testing.T) {
	installDir := t.TempDir()
	c := newCaptureCluster(t, installDir)
	n := c.node
	agentProc := c.startAgent("--install", "--cni-bin-dir", installDir, "--cni-conf-dir", n.CNIConfDir, "--keep-on-exit=false")
	if err := agentProc.WaitLog(ctxT(t, 10*time.Second), "CNI plugin installed"); err != nil {
		t.Fatal(err)
	}
	px := startStandIn(t, c.zdsSocket())
	px.wait("snapshot 0")

	for name, labels := range map[string]map[string]string{"mesh": ambientNS, "plain": nil} {
		if err := c.AddNamespace(name, labels); err != nil {
			t.Fatal(err)
		}
	}
	srv := c.addPod(testcluster.PodSpec{Name: "srv", Namespace: "plain"})
	serve(t, srv.NetNS, "srv", []int{webPort, dnsPort}, []int{dnsPort})
	pod := func(name, namespace string, labels, ann map[string]string) *testcluster.Pod {
		return c.addPod(testcluster.PodSpec{Name: name, Namespace: namespace, Labels: labels, Annotations: ann})
	}
	a := pod("a", "mesh", nil, nil)
	noDNS := pod("nodns", "mesh", nil, map[string]string{rules.AnnotationDNSCapture: "false"})
	exPort := pod("export", "mesh", nil, map[string]string{rules.AnnotationExcludeOutboundPorts: fmt.Sprint(webPort)})
	exRange := pod("exrange", "mesh", nil, map[string]string{rules.AnnotationExcludeOutboundIPRanges: srv.IP.String() + "/32"})
	none := pod("optout", "mesh", optOut, nil)
	plain := pod("plainpod", "plain", nil, nil)
	px.wait("add a", "add nodns", "add export", "add exrange")

	web := netip.AddrPortFrom(srv.IP, webPort)
	dns := netip.AddrPortFrom(srv.IP, dnsPort)
	for _, tc := range []struct {
		from    *testcluster.Pod
		network string
		dst     netip.AddrPort
		want    string
	}{
		{a, "tcp", web, proxied(rules.PortOutbound, web)},
		{a, "udp", dns, "proxy 15053 udp"},
		{a, "tcp", dns, proxied(rules.PortDNS, dns)},
		{noDNS, "tcp", web, proxied(rules.PortOutbound, web)},
		{noDNS, "udp", dns, direct("srv", dnsPort) + " udp"},
		{noDNS, "tcp", dns, proxied(rules.PortOutbound, dns)}, // TCP to 53 is ordinary outbound then
		{exPort, "tcp", web, direct("srv", webPort)},
		{exPort, "udp", dns, "proxy 15053 udp"},
		{exRange, "tcp", web, direct("srv", webPort)},
		{exRange, "udp", dns, direct("srv", dnsPort) + " udp"},
		{exRange, "tcp", dns, direct("srv", dnsPort)},
		{none, "tcp", web, direct("srv", webPort)},
		{none, "udp", dns, direct("srv", dnsPort) + " udp"},
		{plain, "tcp", web, direct("srv", webPort)},
		{plain, "udp", dns, direct("srv", dnsPort) + " udp"},
		// Inbound: to a captured pod's app, through 15006; to a plain pod, direct.
		{srv, "tcp", netip.AddrPortFrom(a.IP, appPort), proxied(rules.PortInbound, netip.AddrPortFrom(a.IP, appPort))},
		{srv, "tcp", netip.AddrPortFrom(plain.IP, appPort), direct("plainpod", appPort)},
	} {
		t.Run(fmt.Sprintf("%s-%s-%s", tc.from.Name, tc.network, tc.dst), func(t *testing.T) {
			if got := exchange(t, tc.from, tc.network, tc.dst); got != tc.want {
				t.Errorf("%s %s → %s: got %q, want %q", tc.from.Name, tc.network, tc.dst, got, tc.want)
			}
		})
	}
	t.Run("kubelet probe from the node reaches the app", func(t *testing.T) {
		if got := exchange(t, n, "tcp", netip.AddrPortFrom(a.IP, appPort)); got != direct("a", appPort) {
			t.Errorf("probe to a captured pod: got %q, want the app", got)
		}
	})
	t.Run("untouched pods have no rules", func(t *testing.T) {
		for _, p := range []*testcluster.Pod{none, plain, srv} {
			if rs := nat(t, p); strings.Contains(rs, "ISTIO") {
				t.Errorf("%s has capture rules:\n%s", p.Name, rs)
			}
		}
		if rs := nat(t, a); !strings.Contains(rs, redirect15001) {
			t.Errorf("a lacks the outbound redirect:\n%s", rs)
		}
	})
	t.Run("status", func(t *testing.T) {
		st := c.podStatus()
		for name, dnsOn := range map[string]bool{"a": true, "nodns": false, "export": true, "exrange": true} {
			s, ok := st[name]
			if !ok || s.State != agent.StateEnabled || s.DNSCapture != dnsOn || s.UpToDate == nil || !*s.UpToDate {
				t.Errorf("status of %s: %+v; want enabled, dnsCapture %v, up to date", name, s, dnsOn)
			}
		}
		for _, name := range []string{"optout", "plainpod", "srv"} {
			if s, ok := st[name]; ok {
				t.Errorf("status for untouched pod %s: %+v", name, s)
			}
		}
		if got := st["exrange"].Settings.ExcludeOutboundIPRanges; len(got) != 1 || got[0] != netip.PrefixFrom(srv.IP, 32) {
			t.Errorf("exrange settings in force: %v", got)
		}
	})

	// Uninstall on exit (--keep-on-exit=false).
	if err := agentProc.Stop(); err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(n.ConfList)
	if err != nil || strings.Contains(string(conf), "ztunnel-cni") {
		t.Errorf("conflist after uninstall (%v):\n%s", err, conf)
	}
	if _, err := os.Stat(filepath.Join(installDir, "ztunnel-cni")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plugin binary after uninstall: %v", err)
	}
	// The uninstall released the captured pods: no rules are left in them,
	// and they reach the network directly, not a node proxy that is going
	// away too (issue 16: uninstalling used to black-hole every ambient pod).
	for _, p := range []*testcluster.Pod{a, noDNS, exPort, exRange} {
		if rs := nat(t, p); strings.Contains(rs, "ISTIO") {
			t.Errorf("%s keeps rules after the uninstall:\n%s", p.Name, rs)
		}
	}
	if got := exchange(t, a, "tcp", web); got != direct("srv", webPort) {
		t.Errorf("a → web after the uninstall: got %q, want direct", got)
	}
	if got := exchange(t, a, "udp", dns); got != direct("srv", dnsPort)+" udp" {
		t.Errorf("a's DNS after the uninstall: got %q, want direct", got)
	}
}

// TestCaptureAgentDown: with the agent stopped an ambient pod's ADD fails
// and the pod never runs; a plain pod starts; with the agent up but no
// proxy the pod stays pending (rules in place, ADD failing); once a proxy
// is connected the runtime's retry succeeds with the rules in place.
func TestCaptureAgentDown(t *testing.T) {
	c := newCaptureCluster(t, "")
	if err := c.AddNamespace("mesh", ambientNS); err != nil {
		t.Fatal(err)
	}
	a, err := c.node.AddPod(ctxT(t, 30*time.Second), testcluster.PodSpec{Name: "a", Namespace: "mesh"})
	var ce *testcluster.CNIError
	if !errors.As(err, &ce) || a == nil || a.Running() {
		t.Fatalf("ADD with the agent down: pod %v, err %v; want a failed ADD", a, err)
	}
	if !strings.Contains(ce.Output, "unreachable") {
		t.Errorf("ADD failure does not say the agent is unreachable: %s", ce.Output)
	}
	if _, err := a.Handle(); !errors.Is(err, testcluster.ErrNoNetNS) {
		t.Fatalf("failed pod's sandbox still exists: %v", err)
	}
	plain := c.addPod(testcluster.PodSpec{Name: "plain"}) // non-ambient: not delayed

	c.startAgent()
	err = a.Retry(ctxT(t, 30*time.Second))
	if !errors.As(err, &ce) || !strings.Contains(ce.Output, "pending") || a.Running() {
		t.Fatalf("ADD with the agent up but no proxy: %v; want a failed ADD saying pending", err)
	}
	if st := c.podStatus()["a"]; st.State != agent.StatePending {
		t.Fatalf("status without a proxy: %+v, want pending", st)
	}

	px := startStandIn(t, c.zdsSocket())
	px.wait("snapshot 0")
	if err := a.Retry(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("ADD retried with a proxy: %v", err)
	}
	px.wait("add a")
	if rs := nat(t, a); !strings.Contains(rs, redirect15001) {
		t.Fatalf("rules missing after the retried ADD:\n%s", rs)
	}
	dst := netip.AddrPortFrom(plain.IP, appPort)
	if got := exchange(t, a, "tcp", dst); got != proxied(rules.PortOutbound, dst) {
		t.Fatalf("a → plain: %q, want it through the proxy", got)
	}
	if st := c.podStatus()["a"]; st.State != agent.StateEnabled || st.Via != "cni" {
		t.Fatalf("status after the retry: %+v, want enabled via cni", st)
	}
}

// TestCaptureNamespaceLabel: labelling a namespace enrolls its running
// pods, deleting an enrolled pod and unlabelling the namespace remove them.
func TestCaptureNamespaceLabel(t *testing.T) {
	c := newCaptureCluster(t, "")
	c.startAgent()
	px := startStandIn(t, c.zdsSocket())
	px.wait("snapshot 0")
	if err := c.AddNamespace("apps", nil); err != nil {
		t.Fatal(err)
	}
	srv := c.addPod(testcluster.PodSpec{Name: "srv"})
	x := c.addPod(testcluster.PodSpec{Name: "x", Namespace: "apps"})
	y := c.addPod(testcluster.PodSpec{Name: "y", Namespace: "apps"})
	dst := netip.AddrPortFrom(srv.IP, appPort)
	if got := exchange(t, x, "tcp", dst); got != direct("srv", appPort) {
		t.Fatalf("before labelling: %q", got)
	}

	if err := c.AddNamespace("apps", ambientNS); err != nil {
		t.Fatal(err)
	}
	px.wait("add x", "add y")
	for _, p := range []*testcluster.Pod{x, y} {
		if rs := nat(t, p); !strings.Contains(rs, redirect15001) {
			t.Fatalf("%s: rules missing after labelling:\n%s", p.Name, rs)
		}
	}
	if got := exchange(t, x, "tcp", dst); got != proxied(rules.PortOutbound, dst) {
		t.Fatalf("after labelling: %q", got)
	}
	if st := c.podStatus()["x"]; st.State != agent.StateEnabled || st.Via != "watch" {
		t.Fatalf("status after labelling: %+v", st)
	}

	if err := y.Delete(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	px.wait("del y")

	if err := c.AddNamespace("apps", nil); err != nil {
		t.Fatal(err)
	}
	px.wait("del x")
	if rs := nat(t, x); strings.Contains(rs, "ISTIO") {
		t.Fatalf("rules left after unlabelling:\n%s", rs)
	}
	if got := exchange(t, x, "tcp", dst); got != direct("srv", appPort) {
		t.Fatalf("after unlabelling: %q", got)
	}
	if st := c.podStatus(); len(st) != 0 {
		t.Fatalf("status after unlabelling: %+v", st)
	}
}

// TestCaptureRestart: a reconnecting proxy gets the pod and a usable netns
// fd in its snapshot; a restarted agent remembers the pod, and repairs a
// rule deleted by hand only with --reconcile-pod-rules-on-startup.
func TestCaptureRestart(t *testing.T) {
	c := newCaptureCluster(t, "")
	agentProc := c.startAgent()
	px := startStandIn(t, c.zdsSocket())
	px.wait("snapshot 0")
	if err := c.AddNamespace("mesh", ambientNS); err != nil {
		t.Fatal(err)
	}
	srv := c.addPod(testcluster.PodSpec{Name: "srv"})
	a := c.addPod(testcluster.PodSpec{Name: "a", Namespace: "mesh"})
	px.wait("add a")
	dst := netip.AddrPortFrom(srv.IP, appPort)
	want := proxied(rules.PortOutbound, dst)
	if got := exchange(t, a, "tcp", dst); got != want {
		t.Fatalf("a → srv: %q", got)
	}

	// The proxy restarts: meanwhile the pod's traffic fails (captured, no
	// listener); the new proxy gets the netns in the snapshot and serves it.
	px.stop()
	if got := exchange(t, a, "tcp", dst); !strings.HasPrefix(got, "error") {
		t.Fatalf("a → srv without a proxy: %q, want a failure (fail closed)", got)
	}
	px = startStandIn(t, c.zdsSocket())
	px.wait("add a", "snapshot 1")
	if got := exchange(t, a, "tcp", dst); got != want {
		t.Fatalf("a → srv after the proxy reconnected: %q", got)
	}

	// Drift: an operator deletes the outbound redirect by hand.
	del := append([]string{"iptables", "-t", "nat"}, strings.Fields(strings.Replace(redirect15001, "-A", "-D", 1))...)
	if out, err := a.Exec(ctxT(t, 10*time.Second), del...); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := exchange(t, a, "tcp", dst); got != direct("srv", appPort) {
		t.Fatalf("after deleting the redirect: %q", got)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		repaired bool
	}{
		{"reconcile off", nil, false},
		{"reconcile on", []string{"--reconcile-pod-rules-on-startup"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := agentProc.Stop(); err != nil {
				t.Fatal(err)
			}
			agentProc = c.startAgent(tc.args...)
			px.wait("add a", "snapshot 1") // remembered across the restart
			if got := strings.Contains(nat(t, a), redirect15001); got != tc.repaired {
				t.Fatalf("redirect present after restart: %v, want %v", got, tc.repaired)
			}
			wantTraffic := direct("srv", appPort)
			if tc.repaired {
				wantTraffic = want
				if !strings.Contains(string(agentProc.Log()), "reconcile: pod rules differ; repairing") {
					t.Error("the repair was not logged")
				}
			}
			if got := exchange(t, a, "tcp", dst); got != wantTraffic {
				t.Fatalf("a → srv: %q, want %q", got, wantTraffic)
			}
			if st := c.podStatus()["a"]; st.State != agent.StateEnabled || st.Via != "restored" {
				t.Fatalf("status after restart: %+v", st)
			}
		})
	}
}
