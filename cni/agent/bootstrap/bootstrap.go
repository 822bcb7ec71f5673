// Package bootstrap assembles the node agent that cmd/ztunnel-cni runs (when
// no container runtime invoked it as a plugin) from its Options: the pod
// source (a directory of YAML, or the API server with the pods/status
// writer and a kubeconfig for the plugin), the agent itself (cni/agent),
// the plugin installer loop (cni/agent/install), and the HTTP servers: a
// loopback-only debug server (/pods, /logging, pprof) and readiness
// (/healthz/ready, internal/daemon).
//
// It is wiring only, moved out of main; it is a package of its own because
// cni/agent/kube imports cni/agent, so cni/agent cannot hold the Kubernetes
// wiring.
package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/cni/agent/install"
	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/cni/runtimecfg"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

// Default addresses of the HTTP servers: /pods (every pod's capture state)
// on loopback only; readiness, which shows nothing else, on every address
// (the agent runs in the host network, and the kubelet probes the host IP).
const (
	DefaultAdminAddr     = "localhost:8000"
	DefaultReadinessAddr = ":8001"
)

// ownerWatch is what Run needs of agentkube.OwnerWatch.
type ownerWatch interface {
	Uninstalling(ctx context.Context) (bool, string)
}

// Readiness tasks: the agent serves its sockets; the chained plugin is
// installed where the runtime looks (the agent's log says why not).
const (
	TaskAgent  = "node agent"
	TaskPlugin = "CNI plugin installed and chained"
)

// InstallCheckInterval spaces re-checks of the installed plugin besides the
// conf dir watch (a primary CNI may rewrite its config and drop our entry).
const InstallCheckInterval = install.KeepResync

// Options are the node agent's flags (see cmd/ztunnel-cni for each one's
// meaning).
type Options struct {
	NodeName, LocalConfig             string
	ZDSSocket, PluginSocket, StateDir string
	// CNIBinDir and CNIConfDir are host paths; "" means the one the
	// container runtime's own configuration names (cni/runtimecfg).
	CNIBinDir, CNIConfDir string
	// HostRoot is where the host's filesystem is mounted ("" or "/": the
	// agent runs on the host): the runtime's configuration and the CNI
	// directories are read and written under it.
	HostRoot                    string
	Install, KeepOnExit         bool
	DNSCapture, IPv6, Reconcile bool
	AdminAddr, ReadinessAddr    string // "" disables that server
	// LogLevel is passed on to the plugin's configuration.
	LogLevel                           string
	ExcludeNamespaces, SystemNamespace string
	// Kubernetes mode.
	Kubeconfig, PluginKubeconfig string
	InCluster                    bool
	// DaemonSetName and DaemonSetNamespace name the agent's own DaemonSet
	// (Kubernetes mode): when it is deleted the agent uninstalls the plugin
	// on exit even with KeepOnExit (an uninstall), and keeps it while it
	// exists (an upgrade). Empty name: the agent cannot tell, KeepOnExit
	// alone decides. Empty namespace: SystemNamespace.
	DaemonSetName, DaemonSetNamespace string
	// NFTables writes pod rules as native nftables (agent.Config.NFTables).
	NFTables bool
}

// KubeMode: pods and namespaces come from the API server.
func (o Options) KubeMode() bool { return o.Kubeconfig != "" || o.InCluster }

// Validate checks what can be checked without the node or the network.
func (o Options) Validate() error {
	switch {
	case o.NodeName == "":
		return errors.New("--node-name is required")
	case o.LocalConfig == "" && !o.KubeMode():
		return errors.New("--local-config (local mode) or --kubeconfig/--in-cluster (Kubernetes mode) is required")
	case o.LocalConfig != "" && o.KubeMode():
		return errors.New("--local-config and --kubeconfig/--in-cluster exclude each other")
	case o.PluginKubeconfig != "" && !o.InCluster:
		return errors.New("--plugin-kubeconfig goes with --in-cluster")
	}
	if o.AdminAddr != "" {
		if err := daemon.ValidateAddr(o.AdminAddr, true); err != nil {
			return fmt.Errorf("--admin-addr: %w", err)
		}
	}
	if o.ReadinessAddr != "" {
		if err := daemon.ValidateAddr(o.ReadinessAddr, false); err != nil {
			return fmt.Errorf("--readiness-addr: %w", err)
		}
	}
	return nil
}

// PluginKubeconfigPath is the kubeconfig the plugin is configured with:
// --kubeconfig itself, or with --in-cluster the one written for it.
func (o Options) PluginKubeconfigPath() string {
	switch {
	case o.Kubeconfig != "":
		return o.Kubeconfig
	case o.PluginKubeconfig != "":
		return o.PluginKubeconfig
	}
	return filepath.Join(o.StateDir, "plugin-kubeconfig")
}

// Servers are the agent's HTTP servers at o's addresses: admin
// (daemon.Debug, loopback only: /pods from pods, /logging, /debug/pprof/)
// and readiness (daemon.Public: /healthz/ready only).
func Servers(o Options, pods http.Handler, level zap.AtomicLevel, ready *daemon.Readiness) []daemon.Spec {
	admin := http.NewServeMux()
	admin.Handle("GET /pods", pods)
	daemon.DebugHandlers(admin, level)
	return []daemon.Spec{
		{Name: "admin", Addr: o.AdminAddr, Exposure: daemon.Debug, Handler: admin},
		{Name: "readiness", Addr: o.ReadinessAddr, Exposure: daemon.Public, Handler: ready},
	}
}

// hostPath is p (a host path) as the agent reaches it.
func (o Options) hostPath(p string) string {
	if o.HostRoot == "" || o.HostRoot == "/" {
		return p
	}
	return filepath.Join(o.HostRoot, p)
}

// CNIDirs resolves the CNI directories: the flags where set, the rest from
// the container runtime's configuration (read anew on each call, so a
// reconfigured runtime is followed). It returns the host paths and where
// they came from, or why they cannot be known: then nothing is installed,
// since a guess would chain the plugin where no runtime reads it.
func (o Options) CNIDirs() (bin, conf, from string, err error) {
	bin, conf = o.CNIBinDir, o.CNIConfDir
	if bin != "" && conf != "" {
		return bin, conf, "--cni-bin-dir and --cni-conf-dir (chart values cni.cniBinDir, cni.cniConfDir)", nil
	}
	d, err := runtimecfg.Detect(runtimecfg.Options{Root: o.HostRoot})
	if err != nil {
		return "", "", "", fmt.Errorf("finding the CNI directories in the container runtime's configuration: %w; "+
			"set --cni-bin-dir and --cni-conf-dir (chart values cni.cniBinDir, cni.cniConfDir)", err)
	}
	from = d.String()
	if bin == "" {
		bin = d.BinDir()
	} else {
		from += "; bin dir from --cni-bin-dir"
	}
	if conf == "" {
		conf = d.ConfDir
	} else {
		from += "; conf dir from --cni-conf-dir"
	}
	return bin, conf, from, nil
}

// installResolver is CNIDirs as the installer reaches the directories.
func (o Options) installResolver() install.Resolver {
	return func() (string, string, string, error) {
		bin, conf, from, err := o.CNIDirs()
		if err != nil {
			return "", "", "", err
		}
		return o.hostPath(bin), o.hostPath(conf), from, nil
	}
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// Run runs the agent until ctx is done; level is the logger's, for /logging.
func Run(ctx context.Context, o Options, log *zap.Logger, level zap.AtomicLevel) error {
	if err := o.Validate(); err != nil {
		return err
	}
	log.Info("starting node agent", zap.String("version", daemon.Version()), zap.Any("options", o))
	var (
		src        cluster.Source
		refresh    func() error
		status     agent.StatusWriter
		pluginKube string
		tasks      []bootTask
		owner      ownerWatch // nil: no DaemonSet to follow
	)
	if o.KubeMode() {
		k, err := kubeWiring(o, log)
		if err != nil {
			return err
		}
		src, status, pluginKube, tasks = k.src, k.status, k.pluginKubeconfig, k.tasks
		if k.owner != nil {
			owner = k.owner
		}
	} else {
		ls := local.New(o.LocalConfig, log.Named("local"), 0)
		src, refresh = ls, func() error { _, err := ls.Load(); return err }
	}
	enrollment := plugin.Enrollment{ExcludeNamespaces: splitList(o.ExcludeNamespaces), SystemNamespace: o.SystemNamespace}
	var host agent.Host = &agent.KernelHost{IPv6: o.IPv6, Mode: rules.DetectMode()}
	if o.NFTables {
		host = &agent.NFTHost{NFTHost: rules.NewNFTHost(o.IPv6), Old: host.(*agent.KernelHost)}
	}
	// exit decides once, when the agent stops, whether this is an
	// uninstall (--keep-on-exit=false, or the agent's DaemonSet deleted) or
	// an upgrade: the agent's release of the pods and the plugin's removal
	// below follow the same answer.
	var (
		exitOnce  sync.Once
		uninstall bool
	)
	exit := func(ctx context.Context) bool {
		exitOnce.Do(func() {
			uninstall = o.Install && !o.KeepOnExit
			if o.Install && !uninstall && owner != nil {
				var why string
				uninstall, why = owner.Uninstalling(ctx)
				log.Info("uninstall or upgrade?", zap.Bool("uninstall", uninstall), zap.String("reason", why))
			}
		})
		return uninstall
	}
	icfg := install.Config{Plugin: map[string]any{
		"name":               install.PluginType,
		"agent_socket":       o.PluginSocket,
		"log_level":          o.LogLevel,
		"exclude_namespaces": enrollment.ExcludeNamespaces,
		"system_namespace":   o.SystemNamespace,
	}}
	if pluginKube != "" {
		icfg.Plugin["kubeconfig"] = pluginKube
	} else {
		icfg.Plugin["local_config_dir"] = o.LocalConfig
	}
	keeper := install.NewKeeper(icfg, o.installResolver())
	var installed func() error
	if o.Install {
		installed = keeper.Installed
		if bin, conf, from, err := o.CNIDirs(); err != nil {
			log.Error("the CNI directories are not known: the plugin cannot be installed and the agent is not ready", zap.Error(err))
		} else {
			log.Info("CNI directories", zap.String("bin_dir", bin), zap.String("conf_dir", conf), zap.String("from", from))
			if o.CNIBinDir != "" || o.CNIConfDir != "" {
				warnIfRuntimeDisagrees(o, bin, conf, log)
			}
		}
	}
	a, err := agent.New(agent.Config{
		PluginInstalled: installed,
		ReleaseOnExit:   exit,
		NodeName:        o.NodeName, Source: src, Refresh: refresh, Status: status,
		ZDSSocket: o.ZDSSocket, PluginSocket: o.PluginSocket, StateDir: o.StateDir,
		Defaults:   rules.PodSettings{DNSCapture: o.DNSCapture, IPv6: o.IPv6},
		Enrollment: enrollment, ReconcileOnStartup: o.Reconcile, NFTables: o.NFTables, Log: log, Host: host,
	})
	if err != nil {
		return err
	}
	// Every goroutine is a task of g, stopped in the reverse order of its
	// start: the agent first (it asks the owner watch whether this is an
	// uninstall), then the installer and the servers, then the API links.
	g := daemon.NewGroup(ctx, log)
	for _, t := range tasks {
		g.Go(t.name, t.run)
	}
	// The agent's handler serves /pods (and more); only /pods is routed to it.
	servers, err := daemon.Listen(log, Servers(o, a.AdminHandler(), level, g.Readiness())...)
	if err != nil {
		g.Stop()
		return errors.Join(err, g.Wait())
	}
	g.Go("http servers", servers.Serve)
	if o.Install {
		// Not ready until the plugin is copied and chained where the
		// runtime reads it: the readiness page names this task.
		g.Go(TaskPlugin, forever(func(ctx context.Context) { keeper.Run(ctx, log.Named("install")) }),
			daemon.ReadyWhen(func() bool { return installed() == nil }))
	}
	g.Go(TaskAgent, a.Run, daemon.ReadyWhen(a.Serving))
	err = g.Wait()
	if exit(context.WithoutCancel(ctx)) {
		ucfg := keeper.Config()
		if ucfg.ConfDir == "" {
			log.Warn("the CNI directories were never known: nothing to uninstall from them")
		} else if uerr := install.Uninstall(ucfg); uerr != nil {
			err = errors.Join(err, uerr)
		} else {
			log.Info("plugin uninstalled", zap.String("conf_dir", ucfg.ConfDir), zap.String("bin_dir", ucfg.BinDir))
		}
		if terr := host.Teardown(); terr != nil {
			err = errors.Join(err, terr)
		}
	} else if o.Install {
		log.Info("leaving the plugin installed (--keep-on-exit): new ambient pods wait for the next agent")
	}
	return err
}

// warnIfRuntimeDisagrees logs, when the flags name CNI directories, any
// the runtime's own configuration names differently: the flags win (they
// are the operator's word), but a plugin chained where the runtime does
// not look captures nothing.
func warnIfRuntimeDisagrees(o Options, bin, conf string, log *zap.Logger) {
	d, err := runtimecfg.Detect(runtimecfg.Options{Root: o.HostRoot})
	if err != nil {
		return
	}
	if (o.CNIBinDir != "" && !slices.Contains(d.BinDirs, bin)) || (o.CNIConfDir != "" && d.ConfDir != conf) {
		log.Warn("the CNI directories set by flag differ from the container runtime's: new pods may not be captured",
			zap.String("bin_dir", bin), zap.String("conf_dir", conf), zap.Stringer("runtime", d))
	}
}
