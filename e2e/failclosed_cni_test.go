package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Issue 12's fail-closed tests of the capture side (items 1, 2, 3, 6):
// driven through the real kernel, the real ztunnel-cni binary and, where
// the bug involves it, the real API server.

// TestFailClosedRuleRepair: a pod opens connections in a tight loop while
// its capture rules are repaired again and again (drift in the nat
// ISTIO_OUTPUT chain, then Apply, as the agent's reconcile does). No
// connection may reach the server directly: the server's own view (who
// connected to it) must show none from the pod, and every answer must come
// from the capture listener. Flushing a chain and re-appending its rules one
// iptables call at a time leaves a window with no redirect; one
// iptables-restore transaction per table does not.
func TestFailClosedRuleRepair(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{})
	n := c.Node(0)
	ctx := ctxT(t, 120*time.Second)
	srv, err := n.AddPod(ctx, testcluster.PodSpec{Name: "srv", Uncaptured: true})
	if err != nil {
		t.Fatal(err)
	}
	var direct atomic.Int64
	ln, err := srv.Listen(fmt.Sprintf(":%d", appPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	// Only the client pods connect to the server, and only when uncaptured.
	go acceptLoop(ln, func(conn net.Conn) {
		direct.Add(1)
		io.WriteString(conn, "direct srv\n")
	})

	for i, mode := range []rules.Mode{rules.ModeLegacy, rules.ModeNFT} {
		t.Run(mode.String(), func(t *testing.T) {
			pod, err := n.AddPod(ctx, testcluster.PodSpec{Name: fmt.Sprintf("client%d", i), Uncaptured: true})
			if err != nil {
				t.Fatal(err)
			}
			// The capture listener, as the node proxy opens it.
			pl, err := pod.Listen(fmt.Sprintf("127.0.0.1:%d", rules.PortOutbound))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pl.Close() })
			go acceptLoop(pl, func(conn net.Conn) { io.WriteString(conn, "proxy\n") })

			h, err := pod.Handle()
			if err != nil {
				t.Fatal(err)
			}
			ap := rules.NewKernelApplier(rules.KernelConfig{Netns: h, Mode: mode})
			rs, err := rules.InPod(rules.PodSettings{DNSCapture: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := ap.Apply(rs); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ap.Remove(rs) })
			direct.Store(0)

			var proxied, uncaptured, failed atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			dst := netip.AddrPortFrom(srv.IP, appPort).String()
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						switch got := dialOnce(pod, dst); got {
						case "proxy":
							proxied.Add(1)
						case "direct srv":
							uncaptured.Add(1)
						default:
							failed.Add(1)
						}
					}
				}()
			}
			ipt := "iptables-" + mode.String()
			const repairs = 20
			for r := range repairs {
				// Drift: an extra (harmless) rule at the head of the chain.
				if out, err := pod.Exec(ctx, ipt, "-t", "nat", "-I", "ISTIO_OUTPUT", "1", "-p", "udp", "--dport", "9", "-j", "RETURN"); err != nil {
					t.Fatalf("drift %d: %v: %s", r, err, out)
				}
				d, err := ap.Check(rs)
				if err != nil || d.Empty() {
					t.Fatalf("drift %d not seen: %v %v", r, d, err)
				}
				if err := ap.Apply(rs); err != nil {
					t.Fatalf("repair %d: %v", r, err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			if d, err := ap.Check(rs); err != nil || !d.Empty() {
				t.Fatalf("rules after the repairs: %v %v", d, err)
			}
			t.Logf("%s: %d repairs, %d connections captured, %d uncaptured, %d failed; server saw %d from the pod",
				mode, repairs, proxied.Load(), uncaptured.Load(), failed.Load(), direct.Load())
			if proxied.Load() < 100 {
				t.Fatalf("only %d connections captured: the loop did not run", proxied.Load())
			}
			if uncaptured.Load() != 0 || direct.Load() != 0 {
				t.Errorf("%d connections escaped the capture during repairs (server saw %d from the pod)", uncaptured.Load(), direct.Load())
			}
		})
	}
}

// dialOnce connects from ns to dst and returns the first answer line, or
// "error: ...".
func dialOnce(ns interface {
	Dial(context.Context, string, string) (net.Conn, error)
}, dst string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := ns.Dial(ctx, "tcp", dst)
	if err != nil {
		return "error: " + err.Error()
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// TestFailClosedNetnsByUID: a tenant pod with NET_ADMIN puts two victims'
// IPs on its own lo, then the victims' namespace is labelled ambient. The
// victims never went through the plugin (no CNI ADD hint), so the agent
// must find their namespaces the way the runtime knows them: through the
// cgroup (kubelet's naming: systemd "…-pod<uid_>.slice" and cgroupfs
// "pod<uid>") of the processes in them. The attacker's namespace must get
// no rules and never reach the node proxy; each victim gets its rules in
// its own namespace; a pod with no process to prove its namespace is not
// enrolled and is reported failed with an error.
func TestFailClosedNetnsByUID(t *testing.T) {
	c := newCaptureCluster(t, "")
	cg := newFakeKubepods(t)
	ctx := ctxT(t, 90*time.Second)
	if err := c.AddNamespace("apps", nil); err != nil {
		t.Fatal(err)
	}
	srv := c.addPod(testcluster.PodSpec{Name: "srv"})
	// Uncaptured: sandboxes made without our plugin, so the agent has no
	// CNI ADD record of them. The attacker comes first, so a scan by
	// namespace name or PID meets it first.
	attacker := c.addPod(testcluster.PodSpec{Name: "attacker", Namespace: "evil", Uncaptured: true})
	victim := c.addPod(testcluster.PodSpec{Name: "victim", Namespace: "apps", Uncaptured: true})
	victim2 := c.addPod(testcluster.PodSpec{Name: "victim2", Namespace: "apps", Uncaptured: true})
	orphan := c.addPod(testcluster.PodSpec{Name: "orphan", Namespace: "apps", Uncaptured: true})
	for _, v := range []*testcluster.Pod{victim, victim2, orphan} {
		if out, err := attacker.Exec(ctx, "ip", "addr", "add", v.IP.String()+"/32", "dev", "lo"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	cg.container(t, attacker, true)
	cg.container(t, victim, true)
	cg.container(t, victim2, false)

	c.startAgent()
	px := startStandIn(t, c.zdsSocket())
	px.wait("snapshot 0")
	if err := c.AddNamespace("apps", ambientNS); err != nil {
		t.Fatal(err)
	}
	px.wait("add victim", "add victim2")
	testkit.Eventually(t, waitTimeout, "orphan reported failed", func() bool { return c.podStatus()["orphan"].State == agent.StateFailed })

	attackerNS, _ := attacker.Handle()
	px.mu.Lock()
	for uid, p := range px.pods {
		if p.ns.ID() == attackerNS.ID() {
			t.Errorf("the node proxy was handed the attacker's namespace for %s", px.names[uid])
		}
	}
	for _, v := range []*testcluster.Pod{victim, victim2} {
		h, _ := v.Handle()
		if p := px.pods[v.UID]; p == nil || p.ns.ID() != h.ID() {
			t.Errorf("the node proxy has no or the wrong namespace for %s", v.Name)
		}
	}
	if px.pods[orphan.UID] != nil {
		t.Error("the orphan pod was handed to the node proxy")
	}
	px.mu.Unlock()

	if rs := nat(t, attacker); strings.Contains(rs, "ISTIO") {
		t.Errorf("the attacker's namespace got capture rules:\n%s", rs)
	}
	if rs := nat(t, orphan); strings.Contains(rs, "ISTIO") {
		t.Errorf("the unproven pod got capture rules:\n%s", rs)
	}
	dst := netip.AddrPortFrom(srv.IP, appPort)
	for _, v := range []*testcluster.Pod{victim, victim2} {
		if got := exchange(t, v, "tcp", dst); got != proxied(rules.PortOutbound, dst) {
			t.Errorf("%s → srv: %q, want it through the proxy", v.Name, got)
		}
	}
	if got := exchange(t, attacker, "tcp", dst); got != direct("srv", appPort) {
		t.Errorf("attacker → srv: %q, want it untouched", got)
	}
	st := c.podStatus()
	for _, v := range []*testcluster.Pod{victim, victim2} {
		if s := st[v.Name]; s.State != agent.StateEnabled || s.Via != "watch" {
			t.Errorf("status of %s: %+v, want enabled via watch", v.Name, s)
		}
	}
	if s := st["orphan"]; s.State != agent.StateFailed || !strings.Contains(s.Error, "network namespace") {
		t.Errorf("status of the orphan: %+v, want failed with an error about its network namespace", s)
	}
	if _, ok := st["attacker"]; ok {
		t.Errorf("status for the attacker: %+v", st["attacker"])
	}
}

// fakeKubepods is a cgroup v2 tree named like kubelet's, under a directory
// of the test's own (/sys/fs/cgroup[/unified]/zt-<test>), holding the
// "containers" of the test's pods: processes started in the pod's network
// namespace and moved into the pod's cgroup.
type fakeKubepods struct {
	root  string
	procs []*testcluster.Proc
}

func newFakeKubepods(t *testing.T) *fakeKubepods {
	t.Helper()
	mnt, err := cgroup2Mount()
	if err != nil {
		t.Skipf("no cgroup v2 hierarchy: %v", err)
	}
	k := &fakeKubepods{root: filepath.Join(mnt, "zt-"+strings.ReplaceAll(t.Name(), "/", "_"))}
	removeCgroupTree(k.root) // leftovers of an aborted run
	if err := os.MkdirAll(k.root, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range k.procs {
			p.Stop()
		}
		if err := removeCgroupTree(k.root); err != nil {
			t.Errorf("removing %s: %v", k.root, err)
		}
	})
	return k
}

// container starts a process in p's namespace inside p's pod cgroup, in
// kubelet's systemd form (…/kubepods-burstable-pod<uid with _>.slice/
// cri-containerd-<id>.scope) or its cgroupfs form
// (…/kubepods/besteffort/pod<uid>/<id>).
func (k *fakeKubepods) container(t *testing.T, p *testcluster.Pod, systemd bool) {
	t.Helper()
	id := strings.ReplaceAll(p.UID, "-", "")
	dir := filepath.Join(k.root, "kubepods", "besteffort", "pod"+p.UID, id)
	if systemd {
		u := strings.ReplaceAll(p.UID, "-", "_")
		dir = filepath.Join(k.root, "kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod"+u+".slice", "cri-containerd-"+id+".scope")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	proc, err := p.Start(testcluster.Process{Name: "container-" + p.Name, Path: "/bin/sleep", Args: []string{"3600"}})
	if err != nil {
		t.Fatal(err)
	}
	k.procs = append(k.procs, proc)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(proc.PID())), 0o644); err != nil {
		t.Fatal(err)
	}
}

// cgroup2Mount is where the cgroup v2 hierarchy is mounted.
func cgroup2Mount() (string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		_, post, ok := strings.Cut(line, " - ")
		if f := strings.Fields(line); ok && len(f) > 4 && strings.HasPrefix(post, "cgroup2 ") {
			return f[4], nil
		}
	}
	return "", errors.New("no cgroup2 mount in /proc/self/mountinfo")
}

// removeCgroupTree kills what runs under dir and removes it, deepest first.
func removeCgroupTree(dir string) error {
	var dirs []string
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	slices.Reverse(dirs)
	var errs []error
	for _, d := range dirs {
		if data, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil {
			for f := range strings.FieldsSeq(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					if proc, err := os.FindProcess(pid); err == nil {
						proc.Kill()
					}
				}
			}
		}
		var err error
		for range 50 {
			if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
