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

	"go.uber.org/zap/zaptest"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/cni/agent/install"
	agentkube "github.com/ztunnel-go/ztunnel-go/cni/agent/kube"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
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

// TestFailClosedUninstall: the plugin with a real API server. During an
// upgrade (the agent's DaemonSet exists, the agent is down) an ambient pod's
// ADD fails closed while a non-ambient pod and a kube-system pod start. On
// uninstall (DaemonSet deleted, then the agent's token revoked with its
// ServiceAccount) a kube-system pod still starts through the plugin (the
// excluded namespace is decided before any API call), the agent's owner
// watch concludes "uninstall" although the API server no longer answers it,
// and once the plugin is taken out of the chain a non-ambient pod starts.
func TestFailClosedUninstall(t *testing.T) {
	s := startKubeAPI(t)
	kc := s.Client()
	ctx := ctxT(t, 3*time.Minute)
	const sysNS, dsName = "istio-system", "ztunnel-cni"
	for ns, labels := range map[string]map[string]string{"plain": nil, "mesh": ambientNS, sysNS: nil} {
		if err := s.EnsureNamespace(ctx, ns, labels); err != nil {
			t.Fatal(err)
		}
	}
	// The agent's ServiceAccount and RBAC, as the chart grants them.
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "ztunnel-cni"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list", "watch"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "ztunnel-cni"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "ztunnel-cni"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: sysNS, Name: "ztunnel-cni"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token, err := s.CreateServiceAccountToken(ctx, sysNS, "ztunnel-cni", "")
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "ztunnel-cni"}
	if _, err := kc.AppsV1().DaemonSets(sysNS).Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: dsName},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "ztunnel-cni"}}},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agentCfg := s.TokenConfig(token)
	kubeconfig := filepath.Join(t.TempDir(), "plugin-kubeconfig")
	if _, err := agentkube.WriteKubeconfig(kubeconfig, agentCfg); err != nil {
		t.Fatal(err)
	}
	agentClients, err := kube.NewClients(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	owner, err := agentkube.NewOwnerWatch(agentClients.Kube, sysNS, dsName, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	wdone := make(chan struct{})
	go func() { defer close(wdone); owner.Run(wctx) }()
	t.Cleanup(func() { wcancel(); <-wdone })

	c := testcluster.New(t, testcluster.Options{PluginDirs: []string{ztunnelCNI(t)}, ExtraPlugins: func(n *testcluster.Node) []map[string]any {
		return []map[string]any{{
			"type": "ztunnel-cni", "agent_socket": filepath.Join(n.Dir, "plugin.sock"), // the agent is down
			"kubeconfig": kubeconfig, "exclude_namespaces": []string{"kube-system"}, "log_level": "debug",
		}}
	}})
	n := c.Node(0)
	forwardAPIServer(t, n, s.Host())
	createNode(t, kc, n.Name)
	start := func(ns, name string) error {
		t.Helper()
		obj := createPod(t, kc, kubePod{ns: ns, name: name, node: n.Name, sa: "default"})
		_, err := n.AddPod(ctx, testcluster.PodSpec{Name: name, Namespace: ns, UID: string(obj.UID)})
		return err
	}

	// Upgrade: the DaemonSet exists, the agent is down.
	for _, p := range [][2]string{{"plain", "web-1"}, {"kube-system", "dns-1"}} {
		if err := start(p[0], p[1]); err != nil {
			t.Fatalf("non-ambient pod %s/%s during an upgrade: %v", p[0], p[1], err)
		}
	}
	var ce *testcluster.CNIError
	if err := start("mesh", "app-1"); !errors.As(err, &ce) || !strings.Contains(ce.Output, "agent unreachable") {
		t.Fatalf("ambient pod during an upgrade: %v, want a failed ADD (fail closed) saying the agent is unreachable", err)
	}
	if un, why := owner.Uninstalling(ctx); un {
		t.Fatalf("owner watch says uninstall while the DaemonSet exists: %s", why)
	}

	// Uninstall: the DaemonSet goes, then the agent's token.
	if err := kc.AppsV1().DaemonSets(sysNS).Delete(ctx, dsName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the owner watch sees the deletion", func() bool { un, _ := owner.Uninstalling(ctx); return un })
	if err := kc.CoreV1().ServiceAccounts(sysNS).Delete(ctx, "ztunnel-cni", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the agent's token is revoked", func() bool {
		_, err := agentClients.Kube.CoreV1().Namespaces().Get(ctx, "plain", metav1.GetOptions{})
		return err != nil
	})
	if err := start("kube-system", "dns-2"); err != nil {
		t.Fatalf("kube-system pod with the agent's token revoked and the agent down: %v", err)
	}
	un, why := owner.Uninstalling(ctx)
	if !un {
		t.Fatalf("owner watch after the DaemonSet's deletion and the token's revocation: %s; want uninstall", why)
	}
	t.Logf("uninstall decision: %s", why)
	if err := install.Uninstall(install.Config{BinDir: t.TempDir(), ConfDir: n.CNIConfDir}); err != nil {
		t.Fatal(err)
	}
	if err := start("plain", "web-2"); err != nil {
		t.Fatalf("non-ambient pod after uninstall: %v", err)
	}
	if err := start("mesh", "app-2"); err != nil {
		t.Fatalf("pod of a formerly ambient namespace after uninstall: %v", err)
	}
}

// forwardAPIServer makes the API server (on this machine's loopback)
// reachable at the same address inside node n, where the runtime runs the
// plugin, by relaying each connection.
func forwardAPIServer(t *testing.T, n *testcluster.Node, host string) {
	t.Helper()
	addr := strings.TrimPrefix(host, "https://")
	ln, err := n.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go acceptLoop(ln, func(in net.Conn) {
		out, err := net.Dial("tcp", addr)
		if err != nil {
			return
		}
		defer out.Close()
		done := make(chan struct{})
		go func() { io.Copy(out, in); out.(*net.TCPConn).CloseWrite(); close(done) }()
		io.Copy(in, out)
		<-done
	})
}
