// Package agent is the ztunnel-go CNI node agent (docs/protocol.md#capture-rules):
// it decides which pods on its node are captured (plugin.IsAmbient, the same
// rule as the chained plugin), installs the in-pod redirection rules inside
// each pod's network namespace (cni/rules), hands the namespace to the node
// proxy over ZDS (cni/zds), keeps kubelet probes working (host SNAT rule and
// probe ipset), reports each pod's redirection state, and remembers the
// enrolled pods across its own restarts (a state file), optionally repairing
// their rules on start.
//
// Pods reach it two ways: the chained plugin's CNI ADD (PluginServer, POST
// /cmdadd on a unix socket; the ADD fails, and the runtime retries, until the
// pod is captured and its proxy acked) and the cluster source (pods already
// running when their namespace is labelled, label removal, deletion).
//
// It is not the plugin (cni/plugin), the rule builder (cni/rules), the ZDS
// wire protocol (cni/zds) or the installer (cni/agent/install), and it does
// not write Kubernetes objects itself: StatusWriter is the seam, implemented
// for the API server by cni/agent/kube.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/cni/zds"
	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// Defaults.
const (
	DefaultZDSSocket    = "/var/run/ztunnel/ztunnel.sock"
	DefaultPluginSocket = plugin.DefaultAgentSocket
	DefaultStateDir     = "/var/run/ztunnel-cni"
	// StateFile is the name of the enrolled-pods file in the state dir.
	StateFile = "pods.json"
	// DefaultResync is how often pods left pending are retried.
	DefaultResync = 2 * time.Second
	// lookupWait bounds how long a CNI ADD waits for the cluster source to
	// show the pod (local mode writes the pod just before running CNI).
	lookupWait = 2500 * time.Millisecond
	// addTimeout bounds one CNI ADD event (the plugin gives up after
	// plugin.AgentTimeout).
	addTimeout = plugin.AgentTimeout - 500*time.Millisecond
)

// Config configures New. Required fields say so; every other zero value has
// a documented meaning.
type Config struct {
	// NodeName is this node's name: only pods with spec.nodeName equal to it
	// are handled. Required.
	NodeName string
	// Source supplies namespaces and pods. Required.
	Source cluster.Source
	// Refresh, if non-nil, makes Source re-read now (local mode: Load); a CNI
	// ADD calls it before looking the pod up. nil means wait for Source's
	// own updates.
	Refresh func() error
	// ZDSSocket is where the node proxy connects; "" means DefaultZDSSocket.
	ZDSSocket string
	// PluginSocket is the plugin event socket; "" means DefaultPluginSocket.
	PluginSocket string
	// StateDir holds StateFile; "" means DefaultStateDir.
	StateDir string
	// Defaults are the agent-wide pod settings (IPv6, DNSCapture) that pod
	// annotations override.
	Defaults rules.PodSettings
	// Enrollment carries the exclusions of the enrollment rule.
	Enrollment plugin.Enrollment
	// ReconcileOnStartup compares every remembered pod's rules with what
	// they should be when Run starts, and repairs the difference.
	ReconcileOnStartup bool
	// Resync spaces retries of pending pods; 0 means DefaultResync.
	Resync time.Duration
	// ReleaseOnExit, asked once when Run ends (nil: never), says whether
	// this exit is an uninstall: then every captured pod's rules and probe
	// ipset entries are removed before the agent lets go of the pods'
	// namespaces, so the pods reach the network directly instead of being
	// redirected to a node proxy that is going away too. On an upgrade or
	// a restart the rules stay (fail closed until the next agent).
	ReleaseOnExit func(context.Context) bool
	// Log is required.
	Log *zap.Logger

	// NFTables selects the native nftables backend for pod rules
	// (rules.NewNFTApplier) over iptables, the default. It migrates the pods
	// an iptables agent captured: the startup reconciliation runs even
	// without ReconcileOnStartup, and finds and replaces their iptables
	// chains (nftables first, so they stay captured). Without it the
	// iptables applier removes the tables an nftables agent left (the way
	// back; restored pods move with ReconcileOnStartup). The default Host
	// follows it: NFTHost (moving the ipsets' members over) or KernelHost.
	NFTables bool
	// Applier returns the rule applier for a pod's namespace. nil means the
	// kernel applier: rules.NewKernelApplier with the iptables variant
	// detected once at start (rules.DetectMode), or with NFTables
	// rules.NewNFTApplier migrating from that variant.
	Applier func(uid string, ns *netns.Handle) rules.Applier
	// PodSysctls sets the sysctls a captured pod's network namespace needs
	// (KernelPodSysctls: tcp_migrate_req, so a node proxy upgrade resets no
	// queued connection) when the pod is captured and when the startup
	// reconciliation checks it; a failure is logged, the pod stays captured.
	// nil means KernelPodSysctls when Applier is nil too (the kernel's
	// rules), else none: a test's fake applier works on the test's own
	// namespace, whose sysctls are not the agent's to change.
	PodSysctls func(ns *netns.Handle) error
	// Host manages the node-side probe SNAT. nil means KernelHost (ipset
	// command and rules.HostProbe in the agent's own network namespace).
	Host Host
	// FindNetns locates the network namespace of a running pod that was
	// never captured in a CNI ADD; hint is the sandbox path a CNI ADD of
	// the pod reported, "" if none. nil means FindPodNetns (by the pod's
	// cgroup or the hint, never by IP alone).
	FindNetns func(ctx context.Context, pod *corev1.Pod, hint string) (string, *netns.Handle, error)
	// Status receives every status change. nil means LogStatus (the log
	// lines of local mode).
	Status StatusWriter
	// PluginInstalled, if non-nil, is nil while the chained CNI plugin is
	// installed in the runtime's CNI directories, else why not
	// (install.Keeper.Installed). The agent is not Ready until it is:
	// without the chain no new pod is captured, so a Ready agent would
	// tell the rollout and the user that the node is meshed when it is
	// not. nil means the agent does not install the plugin (--install=false:
	// someone else does).
	PluginInstalled func() error
}

// Agent is the node agent. Create with New, then Run.
//
// Locking: opMu serialises every operation that changes a pod (CNI ADD,
// source sync, pending retries), so a pod's events are handled in order; mu
// guards the pod table and is never held across I/O, because the ZDS server
// calls Snapshot while an AddWorkload may be waiting behind it.
type Agent struct {
	cfg  Config
	log  *zap.Logger
	zds  *zds.Server
	self netns.ID // the agent's own netns, never a pod's

	opMu      sync.Mutex
	persistMu sync.Mutex // serialises state file writes

	mu      sync.Mutex
	pods    map[string]*podRec      // by UID
	learned map[string]learnedNetns // pod UID → sandbox netns path from CNI ADDs
	ready   bool
}

// New validates cfg, applies defaults, and opens the ZDS socket.
func New(cfg Config) (*Agent, error) {
	switch {
	case cfg.NodeName == "":
		return nil, errors.New("agent: Config.NodeName is required")
	case cfg.Source == nil:
		return nil, errors.New("agent: Config.Source is required")
	case cfg.Log == nil:
		return nil, errors.New("agent: Config.Log is required")
	}
	if cfg.ZDSSocket == "" {
		cfg.ZDSSocket = DefaultZDSSocket
	}
	if cfg.PluginSocket == "" {
		cfg.PluginSocket = DefaultPluginSocket
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	var mode rules.Mode
	if cfg.Applier == nil || cfg.Host == nil {
		mode = rules.DetectMode()
		cfg.Log.Info("iptables variant", zap.Stringer("mode", mode))
	}
	if cfg.Applier == nil && cfg.PodSysctls == nil {
		cfg.PodSysctls = KernelPodSysctls
	}
	switch {
	case cfg.Applier != nil:
	case cfg.NFTables:
		// Both variants: the earlier agent's choice may differ from what
		// DetectMode sees now; a variant without ISTIO chains costs one
		// read of iptables-save.
		cfg.Log.Info("pod rules backend", zap.String("backend", "nftables"))
		cfg.Applier = func(_ string, ns *netns.Handle) rules.Applier {
			return rules.NewNFTApplier(rules.NFTConfig{Netns: ns, MigrateFrom: []rules.Mode{rules.ModeLegacy, rules.ModeNFT}})
		}
	default:
		// MigrateFromNFT: switching nftables back off must not leave pods
		// captured by tables no agent manages any more.
		cfg.Applier = func(_ string, ns *netns.Handle) rules.Applier {
			return rules.NewKernelApplier(rules.KernelConfig{Netns: ns, Mode: mode, MigrateFromNFT: true})
		}
	}
	if cfg.Host == nil {
		cfg.Host = &KernelHost{IPv6: cfg.Defaults.IPv6, Mode: mode}
		if cfg.NFTables {
			cfg.Host = &NFTHost{NFTHost: rules.NewNFTHost(cfg.Defaults.IPv6), Old: &KernelHost{IPv6: cfg.Defaults.IPv6, Mode: mode}}
		}
	}
	if cfg.Status == nil {
		cfg.Status = LogStatus{Log: cfg.Log}
	}
	if err := cfg.Defaults.Validate(); err != nil {
		return nil, fmt.Errorf("agent: default pod settings: %w", err)
	}
	a := &Agent{cfg: cfg, log: cfg.Log, pods: map[string]*podRec{}, learned: map[string]learnedNetns{}}
	self, err := netns.Current()
	if err != nil {
		return nil, fmt.Errorf("agent: own network namespace: %w", err)
	}
	a.self = self.ID()
	self.Close()
	if cfg.FindNetns == nil {
		a.cfg.FindNetns = func(ctx context.Context, pod *corev1.Pod, hint string) (string, *netns.Handle, error) {
			return FindPodNetns(ctx, NetnsQuery{UID: string(pod.UID), IPs: podIPs(pod), Hint: hint, Self: a.self})
		}
	}
	srv, err := zds.Listen(zds.ServerConfig{Path: cfg.ZDSSocket, Snapshotter: a, Log: cfg.Log.Named("zds")})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.zds = srv
	return a, nil
}

// ZDS is the agent's ZDS server (tests use it to wait for proxies).
func (a *Agent) ZDS() *zds.Server { return a.zds }

// Run restores the remembered pods, sets up the host probe rule, serves
// plugin events and ZDS, and follows the cluster source until ctx is done.
// It returns nil on a clean stop and the first failure of any of those, at
// once, otherwise: a source that fails before its first read is such a
// failure. The pods' rules stay in place when it returns (the node proxy
// keeps serving them; a new agent takes over).
//
// Its goroutines are daemon.Group tasks, stopped in reverse order: the
// plugin and ZDS servers first, then the sync loop, then the source.
func (a *Agent) Run(ctx context.Context) error {
	defer a.closeHandles()
	if err := a.cfg.Host.Setup(); err != nil {
		a.zds.Close()
		return fmt.Errorf("agent: host probe setup: %w", err)
	}
	restored := a.restore()

	g := daemon.NewGroup(ctx, a.log)
	g.Go("cluster source", func(ctx context.Context) error {
		if err := a.cfg.Source.Run(ctx); err != nil && ctx.Err() == nil {
			return fmt.Errorf("agent: cluster source: %w", err)
		}
		return nil
	})
	zdsServed := false
	g.Go("pod sync", func(ctx context.Context) error {
		// The first full view of the cluster, so reconciliation and the
		// first sync see the pods' current metadata.
		objs, err := a.waitObjects(ctx)
		if err != nil {
			return nil // stopped before the first read
		}
		if a.cfg.ReconcileOnStartup || a.cfg.NFTables {
			// With nftables, restored pods may still hold an iptables
			// agent's chains: reconciling is how they migrate.
			a.reconcile(ctx, objs)
		} else if restored > 0 {
			a.log.Info("pod rule reconciliation on startup is off; restored pods keep their rules until restarted", zap.Int("pods", restored))
		}
		ps, err := ListenPlugin(a.cfg.PluginSocket, a, a.log)
		if err != nil {
			return err
		}
		// A task the stopping group does not start leaves its socket to us.
		if zdsServed = g.Go("zds server", a.zds.Serve); !zdsServed || !g.Go("plugin server", ps.Serve) {
			ps.Close()
			return nil
		}
		a.mu.Lock()
		a.ready = true
		a.mu.Unlock()
		a.log.Info("node agent ready", zap.String("node", a.cfg.NodeName), zap.String("zds_socket", a.cfg.ZDSSocket),
			zap.String("plugin_socket", a.cfg.PluginSocket), zap.Int("restored_pods", restored))
		return a.loop(ctx)
	})
	err := g.Wait()
	a.mu.Lock()
	a.ready = false
	a.mu.Unlock()
	if !zdsServed {
		a.zds.Close()
	}
	if a.cfg.ReleaseOnExit != nil && a.cfg.ReleaseOnExit(context.WithoutCancel(ctx)) {
		a.releaseAll()
	}
	return err
}

// Ready reports whether Run has started serving and the plugin is
// installed (Config.PluginInstalled).
func (a *Agent) Ready() bool { return a.NotReady() == "" }

// Serving reports whether Run has started serving its sockets.
func (a *Agent) Serving() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ready
}

// NotReady says why the agent is not Ready; "" when it is.
func (a *Agent) NotReady() string {
	if !a.Serving() {
		return "the agent is not serving its sockets yet"
	}
	if a.cfg.PluginInstalled != nil {
		if err := a.cfg.PluginInstalled(); err != nil {
			return "the CNI plugin is not installed and chained: " + err.Error()
		}
	}
	return ""
}

func (a *Agent) waitObjects(ctx context.Context) (*cluster.Objects, error) {
	for {
		objs, ch := a.cfg.Source.Current()
		if objs != nil {
			return objs, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		}
	}
}

// loop syncs with the source on every change, retries pending pods when a
// proxy connects and every Resync.
func (a *Agent) loop(ctx context.Context) error {
	t := time.NewTicker(a.cfg.Resync)
	defer t.Stop()
	for {
		objs, changed := a.cfg.Source.Current()
		connected := a.zds.ProxyConnected()
		a.sync(ctx, objs)
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-connected:
		case <-t.C:
		}
	}
}

func (a *Agent) closeHandles() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.pods {
		r.closeNetns()
	}
}

// learnedNetns is a sandbox path a CNI ADD reported for a pod UID.
type learnedNetns struct {
	path string
	at   time.Time
}

// learnedGrace is how long a hint for a pod the source does not show is
// kept (the ADD may come before the informer sees the pod).
const learnedGrace = time.Minute

// learn records the sandbox path a CNI ADD reported for uid.
func (a *Agent) learn(uid, path string) {
	if uid == "" || path == "" {
		return
	}
	a.mu.Lock()
	old, had := a.learned[uid]
	a.learned[uid] = learnedNetns{path: path, at: time.Now()}
	a.mu.Unlock()
	if !had || old.path != path {
		a.persist() // a restarted agent still knows it
	}
}

// podIPs returns the pod's IPs from its status.
func podIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a)
		}
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			out = append(out, a)
		}
	}
	return out
}

func workloadInfo(p *corev1.Pod) *zdsapi.WorkloadInfo {
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	return &zdsapi.WorkloadInfo{Name: p.Name, Namespace: p.Namespace, ServiceAccount: sa}
}

// statePath is the state file.
func (a *Agent) statePath() string { return filepath.Join(a.cfg.StateDir, StateFile) }

// ensureDir creates the parent of path.
func ensureDir(path string) error { return os.MkdirAll(filepath.Dir(path), 0o755) }
