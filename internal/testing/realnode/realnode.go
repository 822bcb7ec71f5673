// Package realnode brings up a real single-node Kubernetes cluster on this
// machine for the node tests (make test-node): etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kube-proxy (iptables) and the
// kubelet at v1.37.2 from hack/k8s/build.sh, containerd and runc from the
// distribution with a configuration, root and state of their own, the
// reference bridge + host-local CNI plugins as the primary network on bridge
// ztgnode0 (10.233.0.0/24), CoreDNS v1.15.0 (hack/k8s/build.sh coredns) as
// the cluster DNS, a Deployment behind Service kube-system/kube-dns (dns.go),
// and the pause, test-app and CoreDNS images of hack/images/testimage
// imported into containerd (no registry is reachable).
//
// Everything it creates is removed by Stop, and Start first removes what a
// killed earlier run left (processes recorded in BaseDir/pids and the pods'
// cgroups, mounts, containerd state, KUBE-*, CNI and ISTIO_* iptables chains,
// the bridge, sysctls restored to their values before the first run). The
// host quirks it works around are in /work/shared/reference/k8s-real-node.md:
// cgroup v1 (failCgroupV1: false), no CAP_SYS_RESOURCE
// (restrict_oom_score_adj, oomScoreAdj 0), /run/netns propagation.
//
// Only one node can run per machine (one containerd); callers serialize with
// flock /tmp/e2e.lock.
package realnode

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Options say where the binaries and images are.
type Options struct {
	// K8sBin holds etcd, kube-apiserver and kubectl (hack/k8s/build.sh k8s).
	K8sBin string
	// NodeBin holds kubelet, kube-controller-manager, kube-scheduler and
	// kube-proxy (hack/k8s/build.sh node).
	NodeBin string
	// CNIBin holds the reference plugins bridge, host-local and loopback.
	CNIBin string
	// Images are OCI or docker archives imported into containerd; the
	// pause image (PauseImage) and the CoreDNS image (CoreDNSImage) must
	// be among them.
	Images []string
	// Logf receives progress lines; nil discards them.
	Logf func(string, ...any)
	// Detach lets the components outlive the process that started them
	// (make node-up leaves the node for a person to use): they are not
	// killed when it exits, and Clean (make node-down) ends them. Without
	// it they die with the starting process, so a killed test run leaves
	// nothing running.
	Detach bool
}

// Node is a running single-node cluster.
type Node struct {
	opts       Options
	IP         string // the node's address (of the default route's interface)
	Kubeconfig string // admin kubeconfig (system:masters)
	Config     *rest.Config
	Client     kubernetes.Interface
	procs      []*proc
}

// LogDir holds every component's log file.
func (n *Node) LogDir() string { return logDir }

// APIServerURL is the API server's URL on the node's address.
func (n *Node) APIServerURL() string {
	return "https://" + net.JoinHostPort(n.IP, strconv.Itoa(APIServerPort))
}

// Kubectl runs kubectl with the admin kubeconfig and returns its combined
// output.
func (n *Node) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.opts.K8sBin, "kubectl"), append([]string{"--kubeconfig", n.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// ContainerdSocket is the node's containerd socket (ctr -a, crictl -r).
const ContainerdSocket = containerdSocket

// Ctr runs containerd's ctr in the CRI namespace.
func Ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", containerdSocket, "--namespace", ctrNamespace}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (n *Node) logf(format string, args ...any) {
	if n.opts.Logf != nil {
		n.opts.Logf(format, args...)
	}
}

// EnsureHostPackages installs containerd and runc from the distribution
// when they are missing (as `make deps` does for the root tests).
func EnsureHostPackages(logf func(string, ...any)) error {
	var missing []string
	for _, p := range []string{"containerd", "runc"} {
		if exec.Command("dpkg", "-s", p).Run() != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if logf != nil {
		logf("realnode: apt-get install %v", missing)
	}
	if out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get update: %w: %s", err, out)
	}
	cmd := exec.Command("apt-get", append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get install %v: %w: %s", missing, err, out)
	}
	return nil
}

// Start cleans what an earlier run left and brings the node up: it returns
// once the Node is Ready, the default ServiceAccount exists and the cluster
// DNS (CoreDNS) answers through Service kube-dns (~20 s). On failure it
// tears down what it started.
func Start(ctx context.Context, opts Options) (n *Node, err error) {
	n = &Node{opts: opts}
	if err := EnsureHostPackages(opts.Logf); err != nil {
		return nil, err
	}
	if err := Clean(opts.Logf); err != nil {
		return nil, fmt.Errorf("realnode: cleaning an earlier run: %w", err)
	}
	defer func() {
		if err != nil {
			n.logf("realnode: start failed (%v); logs in %s, last lines:\n%s", err, logDir, tailLogs())
			_ = n.Stop()
			n = nil
		}
	}()
	if err := os.RemoveAll(logDir); err != nil {
		return n, err
	}
	if n.IP, err = nodeIP(); err != nil {
		return n, err
	}
	for _, d := range []string{BaseDir, RunDir, logDir, CNIBinDir, CNIConfDir, cniIPAMDir, kubeletDir, podLogsDir, etcdDir, ctrRoot, ctrState} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return n, err
		}
	}
	if err := saveSysctls(); err != nil {
		return n, err
	}
	if err := recordHostDirs(); err != nil {
		return n, err
	}
	if err := prepareNetns(); err != nil {
		return n, err
	}
	p, err := newPKI(pkiDir)
	if err != nil {
		return n, err
	}
	ip := net.ParseIP(n.IP)
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	for _, c := range []struct {
		name string
		subj pkix.Name
	}{
		{"admin", pkix.Name{CommonName: "realnode-admin", Organization: []string{"system:masters"}}},
		{"kubelet", pkix.Name{CommonName: "system:node:" + NodeName, Organization: []string{"system:nodes"}}},
		{"controller-manager", pkix.Name{CommonName: "system:kube-controller-manager"}},
		{"scheduler", pkix.Name{CommonName: "system:kube-scheduler"}},
		{"kube-proxy", pkix.Name{CommonName: "system:kube-proxy"}},
	} {
		if err := p.issue(c.name, c.subj, client, nil, nil); err != nil {
			return n, err
		}
	}
	if err := p.issue("apiserver", pkix.Name{CommonName: "kube-apiserver"}, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{ip, net.ParseIP("127.0.0.1"), net.ParseIP(KubernetesServiceIP)}); err != nil {
		return n, err
	}
	if err := p.issue("kubelet-serving", pkix.Name{CommonName: NodeName}, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		[]string{NodeName, "localhost"}, []net.IP{ip, net.ParseIP("127.0.0.1")}); err != nil {
		return n, err
	}
	kc := map[string]string{}
	for _, name := range []string{"admin", "kubelet", "controller-manager", "scheduler", "kube-proxy"} {
		if kc[name], err = p.kubeconfig(name, n.APIServerURL()); err != nil {
			return n, err
		}
	}
	n.Kubeconfig = kc["admin"]

	// etcd and the API server.
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClientPort)
	if _, err := n.spawn("etcd", filepath.Join(opts.K8sBin, "etcd"),
		"--data-dir="+etcdDir, "--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls=http://127.0.0.1:"+strconv.Itoa(etcdPeerPort),
		"--initial-advertise-peer-urls=http://127.0.0.1:"+strconv.Itoa(etcdPeerPort),
		"--initial-cluster=default=http://127.0.0.1:"+strconv.Itoa(etcdPeerPort),
		"--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return n, err
	}
	api, err := n.spawn("kube-apiserver", filepath.Join(opts.K8sBin, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=0.0.0.0", "--advertise-address="+n.IP, "--secure-port="+strconv.Itoa(APIServerPort),
		"--tls-cert-file="+p.file("apiserver.crt"), "--tls-private-key-file="+p.file("apiserver.key"),
		"--client-ca-file="+p.file("ca.crt"),
		"--kubelet-client-certificate="+p.file("admin.crt"), "--kubelet-client-key="+p.file("admin.key"),
		"--service-account-key-file="+p.file("sa.pub"), "--service-account-signing-key-file="+p.file("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--api-audiences=https://kubernetes.default.svc,istio-ca",
		"--service-cluster-ip-range="+ServiceCIDR,
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--allow-privileged=true", "--profiling=false", "--v=1")
	if err != nil {
		return n, err
	}
	if n.Config, err = clientcmd.BuildConfigFromFlags("", n.Kubeconfig); err != nil {
		return n, fmt.Errorf("admin kubeconfig: %w", err)
	}
	n.Config.QPS, n.Config.Burst = 50, 100
	if n.Client, err = kubernetes.NewForConfig(n.Config); err != nil {
		return n, err
	}
	if err := n.waitReadyz(ctx, api); err != nil {
		return n, err
	}
	n.logf("realnode: API server ready at %s", n.APIServerURL())

	// containerd, its images and the CNI network.
	if err := os.WriteFile(filepath.Join(BaseDir, "containerd.toml"), []byte(containerdConfig()), 0o644); err != nil {
		return n, err
	}
	ctrd, err := n.spawn("containerd", "containerd", "--config", filepath.Join(BaseDir, "containerd.toml"), "--log-level=warn")
	if err != nil {
		return n, err
	}
	if err := waitFor(ctx, 30*time.Second, ctrd, func() error { _, err := Ctr(ctx, "version"); return err }); err != nil {
		return n, fmt.Errorf("containerd: %w", err)
	}
	for _, img := range opts.Images {
		if _, err := Ctr(ctx, "images", "import", "--snapshotter", "overlayfs", img); err != nil {
			return n, err
		}
	}
	for _, ref := range []string{PauseImage, CoreDNSImage} {
		if ok, err := n.HasImage(ctx, ref); err != nil {
			return n, err
		} else if !ok {
			return n, fmt.Errorf("realnode: image %s is not among Options.Images (hack/images/testimage writes it)", ref)
		}
	}
	for _, plugin := range []string{"bridge", "host-local", "loopback"} {
		if err := testkit.CopyFile(filepath.Join(opts.CNIBin, plugin), filepath.Join(CNIBinDir, plugin), 0o755); err != nil {
			return n, fmt.Errorf("cni plugin: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(CNIConfDir, "10-"+NetworkName+".conflist"), []byte(cniConflist()), 0o644); err != nil {
		return n, err
	}

	// The cluster DNS's objects (CoreDNS's Deployment, Service kube-dns in
	// kube-system) before the kubelet, which points pods at it.
	if err := deployClusterDNS(ctx, n); err != nil {
		return n, err
	}

	// Control-plane controllers, kube-proxy and the kubelet.
	for _, c := range []struct {
		name string
		args []string
	}{
		{"kube-controller-manager", []string{"--kubeconfig=" + kc["controller-manager"],
			"--authentication-kubeconfig=" + kc["controller-manager"], "--authorization-kubeconfig=" + kc["controller-manager"],
			"--service-account-private-key-file=" + p.file("sa.key"), "--root-ca-file=" + p.file("ca.crt"),
			"--use-service-account-credentials=true", "--leader-elect=false", "--controllers=*",
			"--service-cluster-ip-range=" + ServiceCIDR,
			"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(kcmPort), "--v=1"}},
		{"kube-scheduler", []string{"--kubeconfig=" + kc["scheduler"],
			"--authentication-kubeconfig=" + kc["scheduler"], "--authorization-kubeconfig=" + kc["scheduler"],
			"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(schedulerPort), "--v=1"}},
	} {
		if _, err := n.spawn(c.name, filepath.Join(opts.NodeBin, c.name), c.args...); err != nil {
			return n, err
		}
	}
	if err := os.WriteFile(filepath.Join(BaseDir, "kube-proxy.yaml"), []byte(kubeProxyConfig(kc["kube-proxy"])), 0o644); err != nil {
		return n, err
	}
	if _, err := n.spawn("kube-proxy", filepath.Join(opts.NodeBin, "kube-proxy"), "--config="+filepath.Join(BaseDir, "kube-proxy.yaml"), "--v=1"); err != nil {
		return n, err
	}
	if err := os.WriteFile(filepath.Join(BaseDir, "kubelet.yaml"), []byte(kubeletConfig(DNSServiceIP)), 0o644); err != nil {
		return n, err
	}
	kubelet, err := n.spawn("kubelet", filepath.Join(opts.NodeBin, "kubelet"),
		"--config="+filepath.Join(BaseDir, "kubelet.yaml"), "--kubeconfig="+kc["kubelet"],
		"--root-dir="+kubeletDir, "--cert-dir="+filepath.Join(kubeletDir, "pki"),
		"--hostname-override="+NodeName, "--node-ip="+n.IP, "--v=1")
	if err != nil {
		return n, err
	}
	if err := n.waitNodeReady(ctx, kubelet); err != nil {
		return n, err
	}
	n.logf("realnode: node %s Ready", NodeName)
	if err := n.waitClusterDNS(ctx, kubelet); err != nil {
		return n, err
	}
	n.logf("realnode: cluster DNS (CoreDNS) answering at %s", DNSServiceIP)
	return n, nil
}

// Stop tears the node down and removes everything it created.
func (n *Node) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if n.Client != nil {
		// Let the kubelet stop the pods (CNI DEL through the chain) first,
		// with no controller manager to recreate them.
		for _, p := range n.procs {
			if p.name == "kube-controller-manager" {
				p.stop(5 * time.Second)
			}
		}
		n.drainPods(ctx)
	}
	// Stop in reverse order of start, gracefully; Clean kills what stays.
	for i := len(n.procs) - 1; i >= 0; i-- {
		n.procs[i].stop(10 * time.Second)
	}
	return Clean(n.opts.Logf)
}

// nodeIP is the IPv4 address of the interface the default route uses.
func nodeIP() (string, error) {
	out, err := exec.Command("ip", "-4", "-o", "route", "get", "192.0.2.123").Output()
	if err != nil {
		return "", fmt.Errorf("node IP: ip route get: %w", err)
	}
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "src" && i+1 < len(f) {
			return f[i+1], nil
		}
	}
	return "", fmt.Errorf("node IP: no src in %q", out)
}

// prepareNetns makes /run/netns the shared bind mount iproute2 makes, which
// the agent's HostToContainer mount of it requires.
func prepareNetns() error {
	name := "ztg-node-probe"
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add: %w: %s", err, out)
	}
	if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del: %w: %s", err, out)
	}
	return nil
}

func (n *Node) waitReadyz(ctx context.Context, api *proc) error {
	rt, err := rest.TransportFor(n.Config)
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: rt, Timeout: 2 * time.Second}
	return waitFor(ctx, 60*time.Second, api, func() error {
		resp, err := hc.Get(n.APIServerURL() + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
}

// waitFor polls check until it succeeds, p exits, or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, p *proc, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it was ready: %v", p.name, p.err, last)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v: %v", p.name, timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// proc is one component process.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// spawn starts bin with its output in logDir/name.log and records its pid
// and start time in pidFile, so a later Clean can end it if this process dies.
func (n *Node) spawn(name, bin string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = BaseDir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Killed with this process (Clean in the next run removes the pods and
	// shims left behind). Pdeathsig fires when the starting *thread* ends,
	// so the child is started and waited for on a thread locked for its life.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if n.opts.Detach {
		// A session of its own: no signal of the starting terminal
		// (Ctrl-C, hangup) reaches it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the child
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := recordPid(name, cmd.Process.Pid); err != nil {
		return p, err
	}
	n.procs = append(n.procs, p)
	return p, nil
}

func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func tailLogs() string {
	var b strings.Builder
	for _, name := range []string{"kubelet", "containerd", "kube-apiserver", "kube-controller-manager", "kube-proxy"} {
		data, err := os.ReadFile(filepath.Join(logDir, name+".log"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", name, strings.Join(lines, "\n"))
	}
	return b.String()
}
