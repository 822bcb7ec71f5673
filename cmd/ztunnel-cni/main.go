// Command ztunnel-cni is both halves of ztunnel-go's traffic capture, in one
// binary so the installer copies exactly what runs: with CNI_COMMAND set (a
// container runtime invoking it) it is the chained CNI plugin
// (cni/plugin.Main); otherwise it is the node agent (cni/agent, assembled by
// cni/agent/bootstrap), normally run by a DaemonSet. It only wires flags to
// packages.
//
// The agent's debug server (--admin-addr: GET /pods, /logging, pprof) binds
// loopback only; readiness (--readiness-addr, /healthz/ready: 200 once the
// agent serves, else 503) shows nothing else and listens on every address.
//
// --check-flags parses and validates the agent's flags, prints what they
// amount to as one JSON object and exits without touching the node or the
// API server: deploy's tests run it with the chart's arguments.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/cni/agent/bootstrap"
	agentkube "github.com/ztunnel-go/ztunnel-go/cni/agent/kube"
	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

// envCNICommand is set by container runtimes when they run a CNI plugin.
const envCNICommand = "CNI_COMMAND"

type options struct {
	bootstrap.Options
	log        daemon.LogFlags
	checkFlags bool
}

func main() {
	if os.Getenv(envCNICommand) != "" {
		plugin.MainWith(agentkube.NewPodSource)
		return
	}
	o, err := parseFlags(os.Args[1:], os.Stderr)
	daemon.ExitOnFlagError("ztunnel-cni", err)
	if o.checkFlags {
		if err := daemon.PrintCheck(os.Stdout, o.summary()); err != nil {
			os.Exit(1)
		}
		return
	}
	lc, _ := o.log.Config() // validated by parseFlags
	log, level, err := daemon.NewLogger(lc)
	daemon.ExitOnFlagError("ztunnel-cni", err)
	ctx, stop := daemon.SignalContext()
	defer stop()
	daemon.Exit(log, "node agent", bootstrap.Run(ctx, o.Options, log, level))
}

// parseFlags parses and validates the agent's args (without the program
// name). Usage and flag errors go to stderr.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("ztunnel-cni", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.NodeName, "node-name", "", "this node's name (required): only pods scheduled here are handled")
	fs.StringVar(&o.LocalConfig, "local-config", "", "local mode: directory of Kubernetes YAML to read namespaces and pods from")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Kubernetes mode: read namespaces and this node's pods from the API server with this kubeconfig (the plugin uses it too)")
	fs.BoolVar(&o.InCluster, "in-cluster", false, "Kubernetes mode with the pod's own service account; the plugin gets a kubeconfig written to --plugin-kubeconfig")
	fs.StringVar(&o.PluginKubeconfig, "plugin-kubeconfig", "", "with --in-cluster: where to write the plugin's kubeconfig, a path that is the same on the host, where the runtime runs the plugin (default <state-dir>/plugin-kubeconfig)")
	fs.StringVar(&o.ZDSSocket, "zds-socket", agent.DefaultZDSSocket, "ZDS socket the node proxy connects to")
	fs.StringVar(&o.PluginSocket, "plugin-socket", agent.DefaultPluginSocket, "socket the CNI plugin sends pod events to")
	fs.StringVar(&o.StateDir, "state-dir", agent.DefaultStateDir, "directory for the enrolled-pods state file")
	fs.StringVar(&o.CNIBinDir, "cni-bin-dir", "", "host's CNI plugin directory the installer copies this binary into (default: the one the container runtime's configuration names: containerd's CRI cni bin_dir, CRI-O's plugin_dirs)")
	fs.StringVar(&o.CNIConfDir, "cni-conf-dir", "", "host's CNI configuration directory whose primary conflist gets the plugin (default: the runtime's: containerd's CRI cni conf_dir, CRI-O's network_dir)")
	fs.StringVar(&o.HostRoot, "host-root", "", "where the host's root filesystem is mounted (the chart: /host); the runtime's configuration and the CNI directories are read and written under it (default: the agent runs on the host)")
	fs.BoolVar(&o.Install, "install", true, "install the plugin binary and conflist entry on start")
	fs.BoolVar(&o.KeepOnExit, "keep-on-exit", true, "leave the plugin installed on exit (safe upgrade: new ambient pods wait for the next agent); false uninstalls it and the host probe rule")
	fs.StringVar(&o.DaemonSetName, "daemonset-name", "", "Kubernetes mode: the agent's own DaemonSet; if it is deleted (uninstall) the plugin is removed from the CNI chain on exit despite --keep-on-exit, and kept while it exists (upgrade)")
	fs.StringVar(&o.DaemonSetNamespace, "daemonset-namespace", "", "namespace of --daemonset-name (default --system-namespace; from the downward API: $(POD_NAMESPACE))")
	fs.BoolVar(&o.DNSCapture, "dns-capture", true, "redirect pods' DNS to the node proxy by default (annotation "+rules.AnnotationDNSCapture+" overrides)")
	fs.BoolVar(&o.IPv6, "ipv6", false, "also program ip6tables rules and the IPv6 probe ipset")
	fs.BoolVar(&o.NFTables, "native-nftables", false, "write pod rules as native nftables (inet tables istio-ambient-*) instead of iptables, moving pods an iptables agent captured over (the chart passes $(NATIVE_NFTABLES), Istio's variable)")
	fs.BoolVar(&o.Reconcile, "reconcile-pod-rules-on-startup", false, "on start, compare every remembered pod's rules with what they should be and repair differences")
	fs.StringVar(&o.AdminAddr, "admin-addr", bootstrap.DefaultAdminAddr, "loopback address of the debug server: GET /pods, /logging, /debug/pprof/ (\"\": none; other addresses are refused)")
	fs.StringVar(&o.ReadinessAddr, "readiness-addr", bootstrap.DefaultReadinessAddr, "address of the readiness server, "+daemon.ReadyPath+": 200 once the agent serves, else 503 (\"\": none)")
	o.log.Register(fs, "", "")
	fs.StringVar(&o.ExcludeNamespaces, "exclude-namespaces", "", "comma-separated namespaces never captured")
	fs.StringVar(&o.SystemNamespace, "system-namespace", plugin.DefaultSystemNamespace, "namespace of the mesh's own pods (never captured)")
	fs.BoolVar(&o.checkFlags, "check-flags", false, "validate the flags, print their effect as JSON and exit without starting anything")
	version := daemon.VersionFlag(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if *version {
		return o, daemon.ErrVersion
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if _, err := o.log.Config(); err != nil {
		return o, err
	}
	o.LogLevel = o.log.Level // the plugin logs at the agent's level
	return o, o.Validate()
}

// summary is what --check-flags prints: the flags' effect as a deployment
// sees it.
type summary struct {
	Mode             string `json:"mode"` // "local" or "kubernetes"
	NodeName         string `json:"node_name"`
	AdminAddr        string `json:"admin_addr,omitempty"` // loopback only
	ReadinessAddr    string `json:"readiness_addr,omitempty"`
	ReadinessPath    string `json:"readiness_path,omitempty"`
	ZDSSocket        string `json:"zds_socket"`
	PluginSocket     string `json:"plugin_socket"`
	StateDir         string `json:"state_dir"`
	CNIBinDir        string `json:"cni_bin_dir,omitempty"`  // a host path; "" with install: the runtime's
	CNIConfDir       string `json:"cni_conf_dir,omitempty"` // a host path; "" with install: the runtime's
	HostRoot         string `json:"host_root,omitempty"`
	PluginKubeconfig string `json:"plugin_kubeconfig,omitempty"` // the plugin reads it on the host
	RulesBackend     string `json:"rules_backend"`               // "iptables" or "nftables"
}

func (o options) summary() summary {
	s := summary{Mode: "local", NodeName: o.NodeName, AdminAddr: o.AdminAddr, ZDSSocket: o.ZDSSocket,
		PluginSocket: o.PluginSocket, StateDir: o.StateDir, RulesBackend: "iptables"}
	if o.NFTables {
		s.RulesBackend = "nftables"
	}
	if o.ReadinessAddr != "" {
		s.ReadinessAddr, s.ReadinessPath = o.ReadinessAddr, daemon.ReadyPath
	}
	if o.Install {
		s.CNIBinDir, s.CNIConfDir, s.HostRoot = o.CNIBinDir, o.CNIConfDir, o.HostRoot
	}
	if o.KubeMode() {
		s.Mode, s.PluginKubeconfig = "kubernetes", o.PluginKubeconfigPath()
	}
	return s
}
