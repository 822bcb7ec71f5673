// Package meshlab runs the whole mesh on one machine with the real binaries:
// a testcluster of network namespaces, one ztunnel-cp (local mode) in node
// 0's namespace, and per node the node agent (ztunnel-cni, which installs its
// CNI plugin into the node's conflist) and the node proxy (ztunnel), wired
// exactly as a DaemonSet would wire them (XDS_ADDRESS, CA_ADDRESS, a node
// token, the ZDS socket). Pods are created through CNI, so the chained plugin
// asks the agent, the agent writes the in-pod rules and hands the pod to the
// node proxy.
//
// It is what `make demo`, the e2e suite (e2e/mesh_test.go) and the mesh
// benchmarks stand on: Start, add pods (from Kubernetes YAML such as
// examples/, or in code), then dial from pods and read the node proxies'
// access logs, metrics and config dumps. It also plays the two cluster
// controllers local mode lacks: a kube-proxy (Service ClusterIPs DNAT'd in
// each node, for clients outside the mesh) and the waypoint Gateway
// controller (a waypoint Gateway gets its Service's ClusterIP as address).
//
// With Options.Kube the same mesh runs in Kubernetes mode on a real API
// server (kube.go): the control plane and the agents read the API, and the
// mesh plays kubelet for the pods it adds. internal/testing/mclab builds a
// two-cluster, two-network mesh out of two of them.
//
// It is not a test framework (no assertions) and not a Kubernetes: see
// testcluster for what the topology is and is not.
package meshlab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Binaries Start runs, by file name.
const (
	BinZtunnel = "ztunnel"
	BinCNI     = "ztunnel-cni"
	BinCP      = "ztunnel-cp"
	// BinWaypoint is cmd/waypoint, run by StartWaypoint.
	BinWaypoint = "waypoint"
)

// Ports and addresses of the processes, inside their node's namespace.
const (
	// CPPort is the control plane's xDS + CA port on node 0's underlay IP.
	CPPort = 15012
	// CPAdminAddr serves the control plane's /config_dump and /metrics.
	CPAdminAddr = "127.0.0.1:15014"
	// ProxyAdminAddr is each node proxy's admin endpoint (/config_dump).
	ProxyAdminAddr = "127.0.0.1:15000"
	// ProxyStatsPort and ProxyReadyPort listen on every address of the node.
	ProxyStatsPort = 15020
	ProxyReadyPort = 15021
	// AgentAdminAddr is each node agent's admin endpoint (/pods, /ready).
	AgentAdminAddr = "127.0.0.1:8000"
)

// Options configures Start. The zero value is a two-node mesh with no
// workloads.
type Options struct {
	// Nodes is the number of nodes; 0 means 2.
	Nodes int
	// Name tells apart several meshes in one test (see testcluster.Options).
	Name string
	// BinDir holds prebuilt ztunnel, ztunnel-cni and ztunnel-cp (`make
	// build` puts them in bin/). "" means go build them into a temporary
	// directory (the Go build cache makes repeats cheap).
	BinDir string
	// CPArgs are extra ztunnel-cp flags (e.g. --jwks-allow-http).
	CPArgs []string
	// Examples are YAML files or directories (*.yaml) of ordinary
	// Kubernetes objects to load after the mesh is up; see LoadYAML. nil
	// means none.
	Examples []string
	// DNS are the names the topology's upstream DNS server ("cluster DNS",
	// pod kube-system/coredns, also every node's resolv.conf nameserver)
	// answers with one A record; other names get NXDOMAIN. nil means none.
	DNS map[string]netip.Addr
	// LogLevel of the three binaries; "" means info.
	LogLevel string
	// TrustDomain of the control plane; "" means cluster.local.
	TrustDomain string
	// ProxyEnv are extra KEY=value variables for every node proxy (after
	// the ones Start sets, so they win), e.g. CRL_PATH. nil means none.
	ProxyEnv []string
	// Kube runs the mesh in Kubernetes mode (see Kube); nil means local
	// mode (the YAML directory).
	Kube *Kube
}

// Mesh is a running mesh. Its methods are safe for concurrent use.
type Mesh struct {
	*testcluster.Cluster
	tb   testkit.TB
	opts Options
	bins string

	// CP is the control plane process (in node 0's namespace).
	CP *testcluster.Proc
	// CPAddr is its xDS + CA address (node 0's underlay IP, port 15012).
	CPAddr netip.AddrPort
	// RootCert is the path of the mesh's root certificate (PEM).
	RootCert string
	// Nodes are the per-node processes, by node index.
	Nodes []*MeshNode
	// DNSPod runs the upstream ("cluster") DNS server; see Options.DNS.
	DNSPod *testcluster.Pod

	userDir string // user YAML (examples, policies), beside the cluster's own
	rootDir string // the config root: cluster/ and user/

	mu   sync.Mutex
	pods map[string]*testcluster.Pod // "ns/name"
	apps []io.Closer

	kpMu   sync.Mutex
	kpLast string // the kube-proxy rules last written
}

// MeshNode is one node's processes.
type MeshNode struct {
	*testcluster.Node
	Agent, Proxy *testcluster.Proc
	// Token is the node's bearer token file (AUTH_TOKEN); TokenValue its
	// content.
	Token, TokenValue string
	// ZDSSocket is the agent's socket the proxy connects to (INPOD_UDS).
	ZDSSocket string
}

// ErrNotReady is returned (wrapped) when a process does not become ready
// in time.
var ErrNotReady = errors.New("meshlab: not ready")

// Start builds the mesh: the cluster, the binaries, the control plane, the
// agents, the upstream DNS server, the node proxies (waiting until each is
// ready), then the Options.Examples. Everything is torn down by tb's
// cleanups.
func Start(tb testkit.TB, opts Options) (*Mesh, error) {
	tb.Helper()
	if opts.Nodes == 0 {
		opts.Nodes = 2
	}
	if opts.LogLevel == "" {
		opts.LogLevel = "info"
	}
	if opts.TrustDomain == "" {
		opts.TrustDomain = "cluster.local"
	}
	m := &Mesh{tb: tb, opts: opts, pods: map[string]*testcluster.Pod{}}
	bins, err := binaries(tb, opts.BinDir)
	if err != nil {
		return nil, err
	}
	m.bins = bins
	// The control plane and the agents watch the config root: the cluster
	// owns (rewrites, prunes) cluster/, user YAML lives in user/.
	m.rootDir = tb.TempDir()
	m.userDir = filepath.Join(m.rootDir, "user")
	pluginDir := filepath.Join(m.rootDir, "cni-bin") // where the agents install the plugin
	for _, d := range []string{m.userDir, pluginDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("meshlab: %w", err)
		}
	}
	m.Cluster = testcluster.New(tb, testcluster.Options{
		Nodes: opts.Nodes, Name: opts.Name,
		ConfigDir:  filepath.Join(m.rootDir, "cluster"),
		PluginDirs: []string{pluginDir},
	})
	tb.Cleanup(m.closeApps)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if opts.Kube != nil {
		if opts.Kube.API == nil {
			return nil, errors.New("meshlab: Options.Kube without an API server")
		}
		if err := m.kubeSetup(ctx); err != nil {
			return nil, err
		}
	}
	if err := m.startCP(ctx); err != nil {
		return nil, err
	}
	if err := m.startDNS(ctx); err != nil {
		return nil, err
	}
	for _, mn := range m.Nodes {
		if err := m.startAgent(ctx, mn, pluginDir); err != nil {
			return nil, err
		}
	}
	// The proxies after the agents: a proxy is ready once it holds the
	// agent's first ZDS snapshot (and, before that, its first xDS sync).
	for _, mn := range m.Nodes {
		if err := m.startProxy(mn); err != nil {
			return nil, err
		}
	}
	for _, mn := range m.Nodes {
		if err := m.waitReady(ctx, mn); err != nil {
			return nil, err
		}
	}
	if len(opts.Examples) > 0 {
		for _, p := range opts.Examples {
			if err := m.LoadYAML(context.Background(), p); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// binaries returns a directory holding the three binaries: dir if given
// (checked), else a fresh build.
func binaries(tb testkit.TB, dir string) (string, error) {
	names := []string{BinZtunnel, BinCNI, BinCP, BinWaypoint}
	if dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return "", fmt.Errorf("meshlab: %w", err)
		}
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(abs, n)); err != nil {
				return "", fmt.Errorf("meshlab: prebuilt binary %s missing in %s (run `make build`): %w", n, abs, err)
			}
		}
		return abs, nil
	}
	out := tb.TempDir()
	start := time.Now()
	if _, err := testkit.Build(out, names...); err != nil {
		return "", fmt.Errorf("meshlab: %w", err)
	}
	tb.Logf("meshlab: built %s in %v", strings.Join(names, ", "), time.Since(start).Round(time.Millisecond))
	return out, nil
}

func (m *Mesh) bin(name string) string { return filepath.Join(m.bins, name) }

func (m *Mesh) startCP(ctx context.Context) error {
	n0 := m.Cluster.Node(0)
	m.CPAddr = netip.AddrPortFrom(n0.UnderlayIP, CPPort)
	stateDir := filepath.Join(n0.Dir, "cp-state")
	m.RootCert = filepath.Join(stateDir, "root-cert.pem")
	var lines []string
	for _, n := range m.Cluster.Nodes() {
		var tok string
		var err error
		if m.opts.Kube != nil {
			tok, err = m.kubeNodeToken(ctx, n)
		} else {
			tok, err = randomToken()
		}
		if err != nil {
			return err
		}
		mn := &MeshNode{Node: n, Token: filepath.Join(n.Dir, "istio-token"), TokenValue: tok, ZDSSocket: filepath.Join(n.Dir, "zds.sock")}
		if err := writeToken(mn.Token, tok); err != nil {
			return err
		}
		lines = append(lines, n.Name+" "+tok)
		m.Nodes = append(m.Nodes, mn)
	}
	var args []string
	ready := "root certificate written"
	if m.opts.Kube != nil {
		args = m.kubeCPArgs(stateDir)
		ready = "kubernetes informers synced"
		if m.opts.Kube.RootCert != "" {
			m.RootCert = m.opts.Kube.RootCert
		}
	} else {
		tokens := filepath.Join(n0.Dir, "node-tokens")
		if err := os.WriteFile(tokens, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return fmt.Errorf("meshlab: %w", err)
		}
		args = []string{
			"--config-dir", m.rootDir, "--listen", m.CPAddr.String(), "--state-dir", stateDir,
			"--node-tokens", tokens, "--trust-domain", m.opts.TrustDomain, "--admin", CPAdminAddr,
		}
	}
	p, err := n0.Start(testcluster.Process{Name: "ztunnel-cp", Path: m.bin(BinCP), Args: append(args, m.opts.CPArgs...)})
	if err != nil {
		return err
	}
	m.CP = p
	if err := p.WaitLog(ctx, ready); err != nil {
		return fmt.Errorf("%w: control plane: %w", ErrNotReady, err)
	}
	return nil
}

func randomToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("meshlab: token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// startAgent runs node n's agent, which installs the plugin into n's
// primary conflist (the cluster's "ztg" network; the "ztg-plain" one stays
// as it is, for pods wired outside the mesh).
func (m *Mesh) startAgent(ctx context.Context, mn *MeshNode, pluginDir string) error {
	n := mn.Node
	source, sourceArg := "--local-config", m.rootDir
	if m.opts.Kube != nil {
		source, sourceArg = "--kubeconfig", m.opts.Kube.API.Kubeconfig()
	}
	p, err := n.Start(testcluster.Process{Name: "ztunnel-cni-" + n.Name, Path: m.bin(BinCNI), Args: []string{
		"--node-name", n.Name,
		source, sourceArg,
		"--zds-socket", mn.ZDSSocket,
		"--plugin-socket", filepath.Join(n.Dir, "plugin.sock"),
		"--state-dir", filepath.Join(n.Dir, "agent-state"),
		"--cni-bin-dir", pluginDir,
		"--cni-conf-dir", n.CNIConfDir,
		"--install=true",
		"--dns-capture=true",
		"--admin-addr", AgentAdminAddr,
		"--log-level", m.opts.LogLevel,
	}})
	if err != nil {
		return err
	}
	mn.Agent = p
	for _, line := range []string{"node agent ready", "CNI plugin installed"} {
		if err := p.WaitLog(ctx, line); err != nil {
			return fmt.Errorf("%w: agent on %s: %w", ErrNotReady, n.Name, err)
		}
	}
	return nil
}

func (m *Mesh) startProxy(mn *MeshNode) error {
	n := mn.Node
	// The node's resolv.conf (ip netns exec bind-mounts
	// /etc/netns/<name>/resolv.conf): the proxy forwards names it does not
	// own to the topology's DNS server, never to the machine's.
	if err := m.writeNodeResolvConf(n); err != nil {
		return err
	}
	// Each node runs its own copy of the binary, as separate machines
	// (or images) would: two proxies mapping one file share its page
	// cache, and the kernel will not page out what another process maps
	// (daemon.ReleaseStartupCode).
	// A restart finds the copy there (and possibly still running: a
	// running executable cannot be written).
	bin := filepath.Join(n.Dir, BinZtunnel)
	if _, err := os.Stat(bin); err != nil {
		if err := testkit.CopyFile(m.bin(BinZtunnel), bin, 0o755); err != nil {
			return fmt.Errorf("meshlab: %w", err)
		}
	}
	p, err := n.Start(testcluster.Process{Name: "ztunnel-" + n.Name, Path: bin, Env: append([]string{
		"XDS_ADDRESS=" + m.CPAddr.String(),
		"CA_ADDRESS=" + m.CPAddr.String(),
		"XDS_ROOT_CA=" + m.RootCert,
		"CA_ROOT_CA=" + m.RootCert,
		"AUTH_TOKEN=" + mn.Token,
		"NODE_NAME=" + n.Name,
		"POD_NAME=ztunnel-" + n.Name,
		"POD_NAMESPACE=istio-system",
		"INSTANCE_IP=" + n.UnderlayIP.String(),
		"TRUST_DOMAIN=" + m.opts.TrustDomain,
		"INPOD_UDS=" + mn.ZDSSocket,
		"ADMIN_ADDR=" + ProxyAdminAddr,
		fmt.Sprintf("STATS_ADDR=0.0.0.0:%d", ProxyStatsPort),
		fmt.Sprintf("READINESS_ADDR=0.0.0.0:%d", ProxyReadyPort),
		"IPV6_ENABLED=false", // the topology is IPv4 only
		"LOG_LEVEL=" + m.opts.LogLevel,
		"LOG_FORMAT=json",
	}, append(m.kubeProxyEnv(), m.opts.ProxyEnv...)...)})
	if err != nil {
		return err
	}
	mn.Proxy = p
	return nil
}

// waitReady polls the proxy's /healthz/ready until it answers 200.
func (m *Mesh) waitReady(ctx context.Context, mn *MeshNode) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", ProxyReadyPort)
	var last string
	for {
		code, body, err := m.NodeHTTP(ctx, mn.Index, url)
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("%d %s %v", code, strings.TrimSpace(string(body)), err)
		select {
		case <-mn.Proxy.Done():
			return fmt.Errorf("%w: ztunnel on %s exited: %v", ErrNotReady, mn.Name, mn.Proxy.Err())
		case <-ctx.Done():
			return fmt.Errorf("%w: ztunnel on %s: %w (last answer: %s)", ErrNotReady, mn.Name, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Node returns node i's processes.
func (m *Mesh) Node(i int) *MeshNode { return m.Nodes[i] }

// ConfigRoot is the directory the control plane and the agents read: the
// cluster's YAML in cluster/, the user's in user/.
func (m *Mesh) ConfigRoot() string { return m.rootDir }

func (m *Mesh) closeApps() {
	m.mu.Lock()
	apps := m.apps
	m.apps = nil
	m.mu.Unlock()
	for _, l := range apps {
		l.Close()
	}
}
