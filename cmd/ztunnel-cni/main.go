// Command ztunnel-cni is both halves of ztunnel-go's traffic capture, in one
// binary so the installer copies exactly what runs: with CNI_COMMAND set (a
// container runtime invoking it) it is the chained CNI plugin
// (cni/plugin.Main); otherwise it is the node agent (cni/agent), normally run
// by a DaemonSet. It only wires flags to packages.
//
// --check-flags parses and validates the agent's flags, prints what they
// amount to as one JSON object and exits without touching the node or the
// API server: deploy's tests run it with the chart's arguments.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/cni/agent/install"
	agentkube "github.com/ztunnel-go/ztunnel-go/cni/agent/kube"
	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
)

// envCNICommand is set by container runtimes when they run a CNI plugin.
const envCNICommand = "CNI_COMMAND"

// installCheckInterval spaces re-checks of the installed plugin (a primary
// CNI may rewrite its conflist and drop our entry).
const installCheckInterval = 5 * time.Second

type options struct {
	nodeName, localConfig              string
	zdsSocket, pluginSocket, stateDir  string
	cniBinDir, cniConfDir              string
	install, keepOnExit                bool
	dnsCapture, ipv6, reconcile        bool
	adminAddr, logLevel                string
	excludeNamespaces, systemNamespace string
	// Kubernetes mode.
	kubeconfig, pluginKubeconfig string
	inCluster                    bool
	checkFlags                   bool
}

func (o options) kubeMode() bool { return o.kubeconfig != "" || o.inCluster }

func main() {
	if os.Getenv(envCNICommand) != "" {
		plugin.MainWith(agentkube.NewPodSource)
		return
	}
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ztunnel-cni:", err)
		os.Exit(2)
	}
	if o.checkFlags {
		if err := json.NewEncoder(os.Stdout).Encode(o.summary()); err != nil {
			os.Exit(1)
		}
		return
	}
	log, err := newLogger(o.logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ztunnel-cni:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("node agent failed", zap.Error(err))
		log.Sync()
		os.Exit(1)
	}
	log.Info("node agent stopped")
	log.Sync()
}

// parseFlags parses and validates the agent's args (without the program
// name). Usage and flag errors go to stderr.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("ztunnel-cni", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.nodeName, "node-name", "", "this node's name (required): only pods scheduled here are handled")
	fs.StringVar(&o.localConfig, "local-config", "", "local mode: directory of Kubernetes YAML to read namespaces and pods from")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubernetes mode: read namespaces and this node's pods from the API server with this kubeconfig (the plugin uses it too)")
	fs.BoolVar(&o.inCluster, "in-cluster", false, "Kubernetes mode with the pod's own service account; the plugin gets a kubeconfig written to --plugin-kubeconfig")
	fs.StringVar(&o.pluginKubeconfig, "plugin-kubeconfig", "", "with --in-cluster: where to write the plugin's kubeconfig, a path that is the same on the host, where the runtime runs the plugin (default <state-dir>/plugin-kubeconfig)")
	fs.StringVar(&o.zdsSocket, "zds-socket", agent.DefaultZDSSocket, "ZDS socket the node proxy connects to")
	fs.StringVar(&o.pluginSocket, "plugin-socket", agent.DefaultPluginSocket, "socket the CNI plugin sends pod events to")
	fs.StringVar(&o.stateDir, "state-dir", agent.DefaultStateDir, "directory for the enrolled-pods state file")
	fs.StringVar(&o.cniBinDir, "cni-bin-dir", "/opt/cni/bin", "CNI plugin directory the installer copies this binary into")
	fs.StringVar(&o.cniConfDir, "cni-conf-dir", "/etc/cni/net.d", "CNI configuration directory whose primary conflist gets the plugin")
	fs.BoolVar(&o.install, "install", true, "install the plugin binary and conflist entry on start")
	fs.BoolVar(&o.keepOnExit, "keep-on-exit", true, "leave the plugin installed on exit (safe upgrade: new ambient pods wait for the next agent); false uninstalls it and the host probe rule")
	fs.BoolVar(&o.dnsCapture, "dns-capture", true, "redirect pods' DNS to the node proxy by default (annotation "+rules.AnnotationDNSCapture+" overrides)")
	fs.BoolVar(&o.ipv6, "ipv6", false, "also program ip6tables rules and the IPv6 probe ipset")
	fs.BoolVar(&o.reconcile, "reconcile-pod-rules-on-startup", false, "on start, compare every remembered pod's rules with what they should be and repair differences")
	fs.StringVar(&o.adminAddr, "admin-addr", "127.0.0.1:8000", "admin endpoint (GET /pods, GET /ready); empty disables it")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.excludeNamespaces, "exclude-namespaces", "", "comma-separated namespaces never captured")
	fs.StringVar(&o.systemNamespace, "system-namespace", plugin.DefaultSystemNamespace, "namespace of the mesh's own pods (never captured)")
	fs.BoolVar(&o.checkFlags, "check-flags", false, "validate the flags, print their effect as JSON and exit without starting anything")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return o, o.validate()
}

// validate checks what can be checked without the node or the network.
func (o options) validate() error {
	switch {
	case o.nodeName == "":
		return errors.New("--node-name is required")
	case o.localConfig == "" && !o.kubeMode():
		return errors.New("--local-config (local mode) or --kubeconfig/--in-cluster (Kubernetes mode) is required")
	case o.localConfig != "" && o.kubeMode():
		return errors.New("--local-config and --kubeconfig/--in-cluster exclude each other")
	case o.pluginKubeconfig != "" && !o.inCluster:
		return errors.New("--plugin-kubeconfig goes with --in-cluster")
	}
	if _, err := zap.ParseAtomicLevel(o.logLevel); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if o.adminAddr != "" {
		if _, _, err := net.SplitHostPort(o.adminAddr); err != nil {
			return fmt.Errorf("--admin-addr: %w", err)
		}
	}
	return nil
}

// readyPath is the admin endpoint's readiness path (agent.AdminHandler).
const readyPath = "/ready"

// summary is what --check-flags prints: the flags' effect as a deployment
// sees it.
type summary struct {
	Mode             string `json:"mode"` // "local" or "kubernetes"
	NodeName         string `json:"node_name"`
	AdminAddr        string `json:"admin_addr,omitempty"`
	ReadyPath        string `json:"ready_path,omitempty"`
	ZDSSocket        string `json:"zds_socket"`
	PluginSocket     string `json:"plugin_socket"`
	StateDir         string `json:"state_dir"`
	CNIBinDir        string `json:"cni_bin_dir,omitempty"`
	CNIConfDir       string `json:"cni_conf_dir,omitempty"`
	PluginKubeconfig string `json:"plugin_kubeconfig,omitempty"` // the plugin reads it on the host
}

func (o options) summary() summary {
	s := summary{Mode: "local", NodeName: o.nodeName, AdminAddr: o.adminAddr, ZDSSocket: o.zdsSocket,
		PluginSocket: o.pluginSocket, StateDir: o.stateDir}
	if o.adminAddr != "" {
		s.ReadyPath = readyPath
	}
	if o.install {
		s.CNIBinDir, s.CNIConfDir = o.cniBinDir, o.cniConfDir
	}
	if o.kubeMode() {
		s.Mode, s.PluginKubeconfig = "kubernetes", o.pluginKubeconfigPath()
	}
	return s
}

// pluginKubeconfigPath is the kubeconfig the plugin is configured with:
// --kubeconfig itself, or with --in-cluster the one written for it.
func (o options) pluginKubeconfigPath() string {
	switch {
	case o.kubeconfig != "":
		return o.kubeconfig
	case o.pluginKubeconfig != "":
		return o.pluginKubeconfig
	}
	return filepath.Join(o.stateDir, "plugin-kubeconfig")
}

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zap.ParseAtomicLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = lvl
	cfg.Sampling = nil
	cfg.OutputPaths, cfg.ErrorOutputPaths = []string{"stdout"}, []string{"stdout"}
	cfg.EncoderConfig.TimeKey, cfg.EncoderConfig.EncodeTime = "time", zapcore.RFC3339NanoTimeEncoder
	return cfg.Build()
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

func run(ctx context.Context, o options, log *zap.Logger) error {
	if err := o.validate(); err != nil {
		return err
	}
	log.Info("starting node agent", zap.Any("options", map[string]any{
		"node": o.nodeName, "local_config": o.localConfig, "zds_socket": o.zdsSocket, "plugin_socket": o.pluginSocket,
		"state_dir": o.stateDir, "install": o.install, "keep_on_exit": o.keepOnExit, "cni_bin_dir": o.cniBinDir,
		"cni_conf_dir": o.cniConfDir, "dns_capture": o.dnsCapture, "ipv6": o.ipv6, "reconcile_pod_rules_on_startup": o.reconcile,
		"admin_addr": o.adminAddr, "exclude_namespaces": o.excludeNamespaces, "system_namespace": o.systemNamespace,
		"kubeconfig": o.kubeconfig, "in_cluster": o.inCluster,
	}))
	var (
		src        cluster.Source
		refresh    func() error
		status     agent.StatusWriter
		pluginKube string
		background []func(context.Context)
	)
	if o.kubeMode() {
		k, err := kubeWiring(o, log)
		if err != nil {
			return err
		}
		src, status, pluginKube, background = k.src, k.status, k.pluginKubeconfig, k.background
	} else {
		ls := local.New(o.localConfig, log.Named("local"), 0)
		src, refresh = ls, func() error { _, err := ls.Load(); return err }
	}
	enrollment := plugin.Enrollment{ExcludeNamespaces: splitList(o.excludeNamespaces), SystemNamespace: o.systemNamespace}
	host := &agent.KernelHost{IPv6: o.ipv6, Mode: rules.DetectMode()}
	a, err := agent.New(agent.Config{
		NodeName:           o.nodeName,
		Source:             src,
		Refresh:            refresh,
		Status:             status,
		ZDSSocket:          o.zdsSocket,
		PluginSocket:       o.pluginSocket,
		StateDir:           o.stateDir,
		Defaults:           rules.PodSettings{DNSCapture: o.dnsCapture, IPv6: o.ipv6},
		Enrollment:         enrollment,
		ReconcileOnStartup: o.reconcile,
		Log:                log,
		Host:               host,
	})
	if err != nil {
		return err
	}

	icfg := install.Config{BinDir: o.cniBinDir, ConfDir: o.cniConfDir, Plugin: map[string]any{
		"name":               install.PluginType,
		"agent_socket":       o.pluginSocket,
		"log_level":          o.logLevel,
		"exclude_namespaces": enrollment.ExcludeNamespaces,
		"system_namespace":   o.systemNamespace,
	}}
	if pluginKube != "" {
		icfg.Plugin["kubeconfig"] = pluginKube
	} else {
		icfg.Plugin["local_config_dir"] = o.localConfig
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var bg sync.WaitGroup
	for _, f := range background {
		bg.Add(1)
		go func() { defer bg.Done(); f(runCtx) }()
	}
	defer func() { cancel(); bg.Wait() }()
	done := make(chan struct{})
	if o.install {
		go func() {
			defer close(done)
			keepInstalled(runCtx, icfg, log)
		}()
	} else {
		close(done)
	}
	if o.adminAddr != "" {
		ln, err := net.Listen("tcp", o.adminAddr)
		if err != nil {
			return fmt.Errorf("--admin-addr: %w", err)
		}
		srv := &http.Server{Handler: a.AdminHandler(), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		log.Info("admin endpoint listening", zap.String("addr", ln.Addr().String()))
	}

	err = a.Run(runCtx)
	cancel()
	<-done
	if o.install && !o.keepOnExit {
		if uerr := install.Uninstall(icfg); uerr != nil {
			err = errors.Join(err, uerr)
		} else {
			log.Info("plugin uninstalled", zap.String("conf_dir", o.cniConfDir))
		}
		if terr := host.Teardown(); terr != nil {
			err = errors.Join(err, terr)
		}
	} else if o.install {
		log.Info("leaving the plugin installed (--keep-on-exit): new ambient pods wait for the next agent")
	}
	return err
}

// kubeParts are Kubernetes mode's agent source, status writer, the plugin's
// kubeconfig and the goroutines they need.
type kubeParts struct {
	src              cluster.Source
	status           agent.StatusWriter
	pluginKubeconfig string
	background       []func(context.Context)
}

func kubeWiring(o options, log *zap.Logger) (*kubeParts, error) {
	rc, err := kube.RESTConfig(o.kubeconfig)
	if err != nil {
		return nil, err
	}
	clients, err := kube.NewClients(rc)
	if err != nil {
		return nil, err
	}
	src, err := agentkube.NewSource(clients.Kube, o.nodeName, log.Named("source"))
	if err != nil {
		return nil, err
	}
	sw, err := agentkube.NewStatusWriter(agentkube.StatusConfig{Client: clients.Kube, Source: src, Log: log.Named("status")})
	if err != nil {
		return nil, err
	}
	k := &kubeParts{src: src, status: sw, pluginKubeconfig: o.kubeconfig, background: []func(context.Context){sw.Run}}
	if o.kubeconfig == "" {
		// In a pod: the plugin runs on the host and cannot read our
		// service account; give it a kubeconfig, rewritten when the
		// projected token rotates.
		path := o.pluginKubeconfigPath()
		if _, err := agentkube.WriteKubeconfig(path, rc); err != nil {
			return nil, err
		}
		k.pluginKubeconfig = path
		k.background = append(k.background, func(ctx context.Context) {
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Minute):
				}
				if _, err := agentkube.WriteKubeconfig(path, rc); err != nil {
					log.Warn("refreshing the plugin kubeconfig failed", zap.Error(err))
				}
			}
		})
	}
	return k, nil
}

// keepInstalled installs the plugin and re-checks it until ctx is done.
func keepInstalled(ctx context.Context, cfg install.Config, log *zap.Logger) {
	var lastErr string
	for {
		res, err := install.Install(cfg)
		switch {
		case err != nil && err.Error() != lastErr:
			log.Warn("installing the CNI plugin failed; retrying", zap.Error(err))
		case err == nil && (res.BinaryChanged || res.ConfChanged):
			log.Info("CNI plugin installed", zap.String("conflist", res.Conflist),
				zap.Bool("binary_changed", res.BinaryChanged), zap.Bool("conflist_changed", res.ConfChanged))
		}
		lastErr = ""
		if err != nil {
			lastErr = err.Error()
		}
		interval := installCheckInterval
		if err != nil {
			interval = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
