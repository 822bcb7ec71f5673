// Package testcluster builds a small Kubernetes-like cluster out of network
// namespaces on this machine, for root tests, the demo and benchmarks: an
// underlay namespace with a bridge, one namespace per node (its pod bridge
// cni0, routes to the other nodes' pod CIDRs over the underlay), and pods
// whose namespaces are wired exactly as a container runtime does it — cnitool
// running the reference bridge/host-local/loopback plugins, chained with
// caller-supplied plugins such as ours. It writes the matching Kubernetes
// objects as YAML for the control plane's local mode, runs real processes
// inside any namespace with per-test logs, and captures the underlay with
// tcpdump.
//
// Everything lives in namespaces named after the test (see names.go): nothing
// is added to the machine's own network namespace and no address outside the
// topology is contacted. Leftovers of an aborted run are deleted first, and
// t.Cleanup deletes everything.
//
// It is not a Kubernetes: there is no API server, scheduler or kube-proxy
// (Service ClusterIPs are reachable only through the mesh), and pods run no
// containers — a pod is its network namespace plus whatever processes a test
// starts in it.
package testcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// EnvCNIBin names the environment variable with the CNI plugin directory
// (`make unit` and `make e2e` set it to .tools/cni/bin).
const EnvCNIBin = "ZTG_CNI_BIN"

// waitDelay bounds how long a finished command's output pipes may stay open.
const waitDelay = 5 * time.Second

// Options configures New. The zero value is a one-node cluster without extra
// CNI plugins.
type Options struct {
	// Nodes is the number of nodes; 0 means 1.
	Nodes int
	// Name tells apart several clusters in one test ("east", "west"); it
	// goes into the namespace-name hash. Empty is fine for one cluster, but
	// two clusters of one test with the same Name share names, so the second
	// New deletes the first as a leftover.
	Name string
	// ExtraPlugins returns the plugin configs appended, after bridge and
	// loopback, to node n's CNI conflist (our ztunnel-cni, say). It is
	// called once per node so configs can point at per-node paths under
	// n.Dir. nil means no extra plugins.
	ExtraPlugins func(n *Node) []map[string]any
	// CNIBinDir holds the plugin binaries. Empty means $ZTG_CNI_BIN, else
	// <repo>/.tools/cni/bin.
	CNIBinDir string
	// PluginDirs are more directories searched for plugins named in
	// ExtraPlugins (where `make build` puts ztunnel-cni, say), after
	// CNIBinDir.
	PluginDirs []string
	// CNITool is the cnitool binary. Empty means <repo>/.tools/bin/cnitool,
	// else cnitool on $PATH.
	CNITool string
	// ConfigDir is where the cluster's YAML is kept up to date. Empty means
	// a directory under t.TempDir(). The cluster owns it: other *.yaml files
	// there are deleted.
	ConfigDir string
}

// Cluster is a running test cluster. Its methods are safe for concurrent use.
type Cluster struct {
	t         testkit.TB
	id        string
	stateDir  string
	configDir string
	ipPath    string
	cnitool   string
	cniPath   string // CNI_PATH: the reference plugins, then Options.PluginDirs

	underlay *NetNS
	nodes    []*Node
	extras   []*NetNS // AddNetNS; guarded by mu

	mu         sync.Mutex
	namespaces map[string]*kube.Namespace
	pods       []*Pod
	services   []*Service
	objects    []kube.Object // Apply'd extra objects
	procs      []*Proc
	captures   []*Capture
	nextSvc    int
}

// Node is one node: a network namespace (embedded: Exec, Start, Listen, Dial
// run on the node, i.e. in host-network context) with its pod bridge.
type Node struct {
	*NetNS
	Index      int
	Name       string       // Kubernetes node name ("node0"), ztunnel's NODE_NAME
	UnderlayIP netip.Addr   // the node's InternalIP
	PodCIDR    netip.Prefix // 10.31.<Index>.0/24
	Gateway    netip.Addr   // cni0's address, the pods' default gateway
	// Dir is a per-node state directory (think the node's /var/run): CNI
	// config and IPAM data live here, and agents started for this node can
	// put their sockets here.
	Dir string
	// CNIConfDir is the node's NETCONFPATH (/etc/cni/net.d). It holds
	// ConfList (network "ztg": bridge, loopback, extras) and a second list
	// for uncaptured pods (network "ztg-plain": bridge, loopback).
	CNIConfDir string
	ConfList   string

	c        *Cluster
	nextPod  int   // guarded by c.mu
	freePods []int // numbers of deleted pods, for reuse; guarded by c.mu
}

// CNI network names in each node's conflist directory.
const (
	netName      = "ztg"
	netNamePlain = "ztg-plain"
)

// New builds the cluster and registers its removal with t.Cleanup. With a
// testing.TB it skips (or fails, see roottest) when not root; any other TB
// (Program) fails. It fails t when the topology cannot be built.
func New(t testkit.TB, opts Options) *Cluster {
	t.Helper()
	return newCluster(t, opts, true)
}

func newCluster(t testkit.TB, opts Options, cleanup bool) *Cluster {
	t.Helper()
	if tb, ok := t.(testing.TB); ok {
		roottest.Require(tb)
	} else if os.Geteuid() != 0 {
		t.Fatalf("testcluster: needs root (network namespaces)")
	}
	if opts.Nodes == 0 {
		opts.Nodes = 1
	}
	if opts.Nodes < 0 || opts.Nodes > MaxNodes {
		t.Fatalf("testcluster: %d nodes; want 1..%d", opts.Nodes, MaxNodes)
	}
	wd, err := os.Getwd() // go test runs in the package directory
	if err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	c := &Cluster{
		t:          t,
		id:         clusterID(wd, t.Name(), opts.Name),
		stateDir:   t.TempDir(),
		configDir:  opts.ConfigDir,
		namespaces: map[string]*kube.Namespace{},
	}
	if c.configDir == "" {
		c.configDir = filepath.Join(c.stateDir, "config")
	}
	if err := c.findTools(opts); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	if err := c.deleteLeftovers(); err != nil {
		t.Fatalf("testcluster: deleting leftovers of an earlier run: %v", err)
	}
	if cleanup {
		t.Cleanup(c.close)
	}
	if err := c.build(opts); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	if err := c.writeConfig(); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	t.Logf("testcluster %s: nodes=%d, namespaces %s*, config %s", c.id, len(c.nodes), nsPrefix(c.id), c.configDir)
	return c
}

func (c *Cluster) findTools(opts Options) error {
	var err error
	if c.ipPath, err = exec.LookPath("ip"); err != nil {
		return fmt.Errorf("ip(8) not found: install iproute2 (`make deps`): %w", err)
	}
	root, _ := testkit.ModuleRoot() // "" when not in the repository: the tools must then be given
	cniBin := opts.CNIBinDir
	if cniBin == "" {
		cniBin = os.Getenv(EnvCNIBin)
	}
	if cniBin == "" && root != "" {
		cniBin = filepath.Join(root, ".tools", "cni", "bin")
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBin, p)); err != nil {
			return fmt.Errorf("CNI plugin %q not found in %q (%s): run `make tools`", p, cniBin, EnvCNIBin)
		}
	}
	c.cniPath = strings.Join(append([]string{cniBin}, opts.PluginDirs...), string(filepath.ListSeparator))
	c.cnitool = opts.CNITool
	if c.cnitool == "" && root != "" {
		if p := filepath.Join(root, ".tools", "bin", "cnitool"); fileExists(p) {
			c.cnitool = p
		}
	}
	if c.cnitool == "" {
		if c.cnitool, err = exec.LookPath("cnitool"); err != nil {
			return errors.New("cnitool not found: run `make tools`")
		}
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// build creates the underlay and the nodes.
func (c *Cluster) build(opts Options) error {
	ul, err := c.newNetNS(underlayNS(c.id))
	if err != nil {
		return err
	}
	c.underlay = ul
	// The underlay carries IPv4 only: no IPv6 router solicitations or MLD
	// reports in captures.
	for _, k := range []string{"net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"} {
		if err := ul.sysctl(k, "1"); err != nil {
			return err
		}
	}
	if err := c.ipBatch(ul.name, "link add br0 type bridge", "link set br0 up"); err != nil {
		return err
	}
	for i := 0; i < opts.Nodes; i++ {
		if err := c.addNode(i, opts); err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
	}
	return nil
}

func (c *Cluster) addNode(i int, opts Options) error {
	ns, err := c.newNetNS(nodeNS(c.id, i))
	if err != nil {
		return err
	}
	n := &Node{
		NetNS:      ns,
		Index:      i,
		Name:       nodeName(i),
		UnderlayIP: underlayIP(i),
		PodCIDR:    podCIDR(i),
		Gateway:    podGateway(i),
		Dir:        filepath.Join(c.stateDir, nodeName(i)),
		c:          c,
	}
	n.CNIConfDir = filepath.Join(n.Dir, "net.d")
	n.ConfList = filepath.Join(n.CNIConfDir, "10-"+netName+".conflist")
	c.nodes = append(c.nodes, n)

	// The veth is created inside the underlay with its peer born in the
	// node: it never exists in the root namespace, so fixed names are safe.
	veth := fmt.Sprintf("n%d", i)
	if err := c.ipBatch(c.underlay.name,
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", veth, ns.name),
		fmt.Sprintf("link set %s master br0 up", veth)); err != nil {
		return err
	}
	// Forwarding between cni0 and eth0; IPv4 only on the underlay side; and
	// no reverse-path filter inherited from the machine deciding outcomes.
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv6.conf.eth0.disable_ipv6", "1"},
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
		{"net.ipv4.conf.eth0.rp_filter", "0"},
	} {
		if err := ns.sysctl(kv[0], kv[1]); err != nil {
			return err
		}
	}
	ulPrefix := netip.MustParsePrefix(UnderlayCIDR)
	cmds := []string{
		fmt.Sprintf("addr add %s/%d dev eth0", n.UnderlayIP, ulPrefix.Bits()),
		"link set eth0 up",
		// The pod bridge exists before the first pod, so the node's pod CIDR
		// is routable at once; the bridge plugin adopts it.
		"link add cni0 type bridge",
		fmt.Sprintf("addr add %s/%d dev cni0", n.Gateway, n.PodCIDR.Bits()),
		"link set cni0 up",
	}
	for j := 0; j < opts.Nodes; j++ {
		if j != i {
			cmds = append(cmds, fmt.Sprintf("route add %s via %s dev eth0", podCIDR(j), underlayIP(j)))
		}
	}
	if err := c.ipBatch(ns.name, cmds...); err != nil {
		return err
	}

	var extras []map[string]any
	if opts.ExtraPlugins != nil {
		extras = opts.ExtraPlugins(n)
	}
	if err := os.MkdirAll(n.CNIConfDir, 0o755); err != nil {
		return err
	}
	if err := writeConfList(n.ConfList, netName, n, extras); err != nil {
		return err
	}
	return writeConfList(filepath.Join(n.CNIConfDir, "90-"+netNamePlain+".conflist"), netNamePlain, n, nil)
}

// newNetNS creates a named namespace with lo up.
func (c *Cluster) newNetNS(name string) (*NetNS, error) {
	ns := &NetNS{c: c, name: name}
	if err := ns.create(); err != nil {
		return nil, err
	}
	return ns, nil
}

func (ns *NetNS) create() error {
	if err := ns.c.ipCmd("netns", "add", ns.name); err != nil {
		return err
	}
	if err := ns.c.ipCmd("-n", ns.name, "link", "set", "lo", "up"); err != nil {
		return err
	}
	return ns.open()
}

// destroy closes the handle and deletes the namespace (and so every link in
// it).
func (ns *NetNS) destroy() error {
	ns.close()
	if err := ns.c.ipCmd("netns", "del", ns.name); err != nil && fileExists(ns.NetNSPath()) {
		return err
	}
	return nil
}

func (c *Cluster) ipCmd(args ...string) error {
	cmd := exec.Command(c.ipPath, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// ipBatch runs several ip(8) commands inside namespace ns in one process.
func (c *Cluster) ipBatch(ns string, cmds ...string) error {
	cmd := exec.Command(c.ipPath, "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -n %s -batch [%s]: %w: %s", ns, strings.Join(cmds, "; "), err, bytes.TrimSpace(out))
	}
	return nil
}

// writeConfList writes a CNI conflist for node n: bridge (host-local IPAM,
// addresses requested through the "ips" capability), loopback, extras.
func writeConfList(path, name string, n *Node, extras []map[string]any) error {
	plugins := []any{
		map[string]any{
			"type":         "bridge",
			"bridge":       "cni0",
			"isGateway":    true,
			"hairpinMode":  true,
			"capabilities": map[string]bool{"ips": true},
			"ipam": map[string]any{
				"type":    "host-local",
				"dataDir": filepath.Join(n.Dir, "ipam"),
				"ranges": [][]map[string]string{{{
					"subnet":     n.PodCIDR.String(),
					"rangeStart": podIP(n.Index, 0).String(),
					"gateway":    n.Gateway.String(),
				}}},
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
			},
		},
		map[string]any{"type": "loopback"},
	}
	for _, e := range extras {
		plugins = append(plugins, e)
	}
	data, err := json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0",
		"name":       name,
		"plugins":    plugins,
	}, "", "  ")
	if err != nil {
		return fmt.Errorf("conflist %s: %w", path, err)
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Node returns node i (0-based).
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// Nodes returns all nodes.
func (c *Cluster) Nodes() []*Node { return append([]*Node(nil), c.nodes...) }

// Underlay is the namespace holding the underlay bridge "br0" that connects
// the nodes (for tcpdump and the like).
func (c *Cluster) Underlay() *NetNS { return c.underlay }

// ID is the cluster's name stem: namespaces are "zt-<ID>-...".
func (c *Cluster) ID() string { return c.id }

// ConfigDir is the directory the cluster keeps its Kubernetes YAML in; it is
// rewritten (file by file, atomically) after every change.
func (c *Cluster) ConfigDir() string { return c.configDir }

// StateDir is the cluster's scratch directory (logs, node dirs), removed
// after the test.
func (c *Cluster) StateDir() string { return c.stateDir }

// deleteLeftovers removes every namespace carrying this cluster's prefix: an
// earlier run of the same test that crashed or skipped cleanup. Processes
// still inside them (started by that run) are killed first.
func (c *Cluster) deleteLeftovers() error {
	names, err := listNetNS(nsPrefix(c.id))
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		c.t.Logf("testcluster: deleting leftover namespace %s", name)
		KillNetNSProcesses(filepath.Join(netnsDir, name))
		ns := &NetNS{c: c, name: name}
		if err := ns.destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// listNetNS returns the named namespaces starting with prefix.
func listNetNS(prefix string) ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// KillNetNSProcesses SIGKILLs every process whose network namespace is the
// one bound at path (what `ip netns pids` lists), except this process. Used
// to sweep leftovers of an aborted run before deleting its namespaces.
func KillNetNSProcesses(path string) {
	var want syscall.Stat_t
	if err := syscall.Stat(path, &want); err != nil {
		return
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil || st.Dev != want.Dev || st.Ino != want.Ino {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(p, "/proc/%d/ns/net", &pid); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// close is the t.Cleanup: captures, CNI DEL for every pod (while the
// processes a DEL may talk to are still up), processes, then namespaces.
func (c *Cluster) close() {
	c.mu.Lock()
	captures := append([]*Capture(nil), c.captures...)
	pods := append([]*Pod(nil), c.pods...)
	procs := append([]*Proc(nil), c.procs...)
	c.mu.Unlock()

	for _, cp := range captures {
		cp.kill()
	}
	for i := len(pods) - 1; i >= 0; i-- {
		p := pods[i]
		if p.HostNetwork {
			continue
		}
		if _, err := p.Handle(); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := p.cniDel(ctx); err != nil {
				c.t.Logf("testcluster: cleanup: %v", err)
			}
			cancel()
		}
	}
	for i := len(procs) - 1; i >= 0; i-- {
		if procs[i].stopped.Load() {
			continue // the test stopped it and saw the result
		}
		if err := procs[i].Stop(); err != nil {
			c.t.Logf("testcluster: cleanup: %v", err)
		}
	}
	if c.t.Failed() {
		for _, p := range procs {
			c.t.Logf("testcluster: last lines of %s (%s):\n%s", p.name, p.logPath, tail(p.Log(), 60))
		}
	}
	var errs []error
	for _, p := range pods {
		if !p.HostNetwork {
			errs = append(errs, p.NetNS.destroy())
		}
	}
	c.mu.Lock()
	extras := append([]*NetNS(nil), c.extras...)
	c.mu.Unlock()
	for _, ns := range extras {
		errs = append(errs, ns.destroy())
	}
	for _, n := range c.nodes {
		errs = append(errs, n.NetNS.destroy())
	}
	if c.underlay != nil {
		errs = append(errs, c.underlay.destroy())
	}
	// A namespace whose setup failed half-way was never tracked: sweep by
	// prefix, as the next run would.
	errs = append(errs, c.deleteLeftovers())
	if err := errors.Join(errs...); err != nil {
		c.t.Errorf("testcluster: cleanup: %v", err)
	}
	if left, err := listNetNS(nsPrefix(c.id)); err != nil || len(left) > 0 {
		c.t.Errorf("testcluster: cleanup left namespaces %v (%v)", left, err)
	}
}
