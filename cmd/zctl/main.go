// Command zctl explains what a node proxy is doing, from its admin config
// dump (live, or saved to a file):
//
//	zctl config-dump [--admin ADDR | -f FILE] [workloads|services|policies|certificates|pods]
//	zctl explain [--admin ADDR | -f FILE] [--waypoint-admin ADDR | --waypoint-file FILE]...
//	             [--method M] [--path P] [-o table|json|yaml] <source-pod> <destination>
//	zctl check ...   (an alias of explain)
//	zctl analyze [-o table|json|yaml] [--agent-admin ADDR | --agent-file FILE]... <dir> | --kubeconfig FILE | --in-cluster
//	zctl status [--cp-admin ADDR | -f FILE] [-o table|json|yaml]
//	zctl connections [--admin ADDR | -f FILE] [--workload W] [--direction in|out] [-o ...]
//	zctl log [--admin ADDR] [--level [default:]LEVEL | --reset]
//	zctl precheck [--after-install] [--cni-bin-dir DIR] [--cni-conf-dir DIR] [--kubeconfig FILE] [-o table|json|yaml]
//	zctl waypoint apply|list|status|delete [-n NS] [--enroll-namespace] [--for ...]
//
// config-dump prints the node's state as tables. explain rebuilds the state
// offline and runs the data path's own routing decision (route.Outbound,
// with the services' load-balancing settings) and L4 authorization
// (rbac.Evaluate, with the identity the destination node proxy sees) on it,
// step by step, naming the object that decided each step; given a
// waypoint's config (--waypoint-admin or --waypoint-file) it runs the
// waypoint's own authorization (proxy/waypoint) for the request
// (--method, --path) as well, and it flags an indirect path (direct access
// and the way through the waypoint decided differently). It exits 3 when
// the connection would be denied or refused, 4 when the waypoint's verdict
// depends on the request and none was given. analyze reads a directory of
// YAML as local mode does, runs the control plane's translation on it and
// lists what will not work (codes ZTG0001…); it exits 2 on an error finding.
// status lists the proxies connected to the control plane and their xDS
// sync state (its /debug/syncz), as istioctl proxy-status does; connections
// a node proxy's open connections (its /connections); log reads or sets a
// proxy's log level (its /logging); precheck checks that the node (and the
// cluster) can run ztunnel-go; waypoint applies, lists and deletes waypoint
// Gateways (the control plane deploys them).
//
// zctl, zctl -h and zctl <command> -h print usage and contact nothing. It
// only reads, except log --level and --reset, which change the level, and
// waypoint apply and delete.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, errDenied):
		os.Exit(3)
	case errors.Is(err, errDepends), errors.Is(err, errRemote):
		os.Exit(4)
	case errors.Is(err, errFindings):
		os.Exit(2)
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "zctl:", err)
		os.Exit(1)
	}
}

// commands are zctl's commands with their argument synopsis and summary.
var commands = []struct{ name, args, summary string }{
	{"config-dump", "[workload|service|policy|certificate|pods|all] [-o table|json|yaml] [--namespace NS] [--node N] [--address IP]", "print the node proxy's state, as istioctl ztunnel-config"},
	{"explain", "<source-pod> <destination>", "follow one connection through routing and authorization; exit 3 if denied"},
	{"check", "<source-pod> <destination>", "alias of explain"},
	{"analyze", "<dir> | --kubeconfig FILE | --in-cluster", "check a directory of YAML or the live cluster with the control plane's translation; exit 2 on errors"},
	{"status", "[--cp-admin ADDR | -f FILE]", "each connected proxy's xDS sync state per type, from the control plane"},
	{"connections", "[--workload W] [--direction in|out]", "the node proxy's open connections: peers, identities, bytes, age"},
	{"log", "[--level [default:]LEVEL | --reset]", "read or set the node proxy's log level (one per process)"},
	{"precheck", "[--after-install] [--cni-bin-dir DIR] [--cni-conf-dir DIR] [--kubeconfig FILE]", "can this node (and cluster) run ztunnel-go, before or after the install; exit 2 on a FAIL"},
	{"waypoint", "apply|list|status|delete [-n NS] [--enroll-namespace] [--for service|workload|all]", "manage waypoint Gateways, as istioctl waypoint"},
	{"version", "(no arguments)", "the release zctl was built as (the proxies' is in status)"},
}

// subcommands are the commands that parse their own flags.
var subcommands = map[string]func(args []string, out io.Writer) error{
	"status":      runStatus,
	"connections": runConnections,
	"log":         runLog,
	"precheck":    runPrecheck,
	"waypoint":    runWaypoint,
	"version":     runVersion,
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: zctl <command> [--admin ADDR | -f FILE] [flags] [args]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-12s %s\n  %-12s   %s\n", c.name, c.args, "", c.summary)
	}
	fmt.Fprintln(w, "\nThe source pod is a workload uid, namespace/name or IP; the destination is ip:port, or host:port\n"+
		"resolved as the source pod's DNS proxy would answer it. Run zctl <command> -h for its flags.")
}

// options are the flags every command takes.
type options struct {
	admin, file, output string
	// explain's waypoint inputs.
	waypointAdmins, waypointFiles stringList
	headers                       stringList
	jwt                           string
	method, path                  string
	// config-dump's filters.
	filter dumpFilter
	// analyze's live cluster and node agents.
	kubeconfig              string
	inCluster               bool
	agentAdmins, agentFiles stringList
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func run(args []string, out, errOut io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		usage(out)
		return nil
	}
	name := args[0]
	synopsis := ""
	for _, c := range commands {
		if c.name == name {
			synopsis = c.args
		}
	}
	if synopsis == "" {
		usage(errOut)
		return fmt.Errorf("unknown command %q", name)
	}
	if f := subcommands[name]; f != nil {
		return f(args[1:], out)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	var o options
	if name != "analyze" { // analyze reads a YAML directory, not a proxy
		fs.StringVar(&o.admin, "admin", "localhost:15000", "the node proxy's admin address")
		fs.StringVar(&o.file, "file", "", "read a saved /config_dump instead of asking the proxy")
		fs.StringVar(&o.file, "f", "", "short for --file")
	}
	fs.StringVar(&o.output, "o", "table", "output format: table, json or yaml")
	if name == "config-dump" {
		// istioctl ztunnel-config's filters, under its names too.
		for _, n := range []string{"namespace", "workload-namespace", "service-namespace", "policy-namespace"} {
			fs.StringVar(&o.filter.namespace, n, "", "only objects of this namespace")
		}
		fs.StringVar(&o.filter.node, "node", "", "only workloads on this node")
		fs.StringVar(&o.filter.address, "address", "", "only workloads with this address")
	}
	if name == "analyze" {
		fs.StringVar(&o.kubeconfig, "kubeconfig", "", "analyze the live cluster this kubeconfig points at (instead of a directory)")
		fs.BoolVar(&o.inCluster, "in-cluster", false, "analyze the live cluster, with the pod's service account")
		fs.Var(&o.agentAdmins, "agent-admin", "a node agent's admin address: its /pods add each pod's capture rules (repeatable)")
		fs.Var(&o.agentFiles, "agent-file", "a node agent's saved /pods (repeatable)")
	}
	if name == "explain" || name == "check" {
		fs.Var(&o.waypointAdmins, "waypoint-admin", "a waypoint's admin address, to run its L7 authorization (repeatable)")
		fs.Var(&o.waypointFiles, "waypoint-file", "a waypoint's saved /config_dump (repeatable)")
		fs.StringVar(&o.method, "method", "", "the HTTP method at the waypoint (default GET when --path is given)")
		fs.StringVar(&o.path, "path", "", "the HTTP path at the waypoint (default / when --method is given)")
		fs.Var(&o.headers, "header", "a request header at the waypoint, \"Name: value\" (repeatable)")
		fs.StringVar(&o.jwt, "jwt", "", "a JWT sent as Authorization: Bearer, checked by the waypoint's RequestAuthentications")
	}
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: zctl %s [flags] %s\n\nflags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	if name == "config-dump" {
		d, from, err := load(o)
		if err != nil {
			return err
		}
		return configDump(out, d, from, pos, o.filter, o.output)
	}
	if name == "analyze" {
		return runAnalyze(out, o, pos)
	}
	if len(pos) != 2 {
		fs.Usage()
		return fmt.Errorf("%s wants <source-pod> <destination>", name)
	}
	switch o.output {
	case "table", "json", "yaml":
	default:
		return fmt.Errorf("unknown output format %q (want table, json or yaml)", o.output)
	}
	d, from, err := load(o)
	if err != nil {
		return err
	}
	wps, err := loadWaypoints(o.waypointAdmins, o.waypointFiles)
	if err != nil {
		return err
	}
	hdr, err := parseHeaders(o.headers, o.jwt)
	if err != nil {
		return err
	}
	e, err := explain(d, from, pos[0], pos[1], &request{waypoints: wps, method: o.method, path: o.path, header: hdr}, nil)
	if err != nil {
		return err
	}
	if err := writeExplanation(out, e, o.output); err != nil {
		return err
	}
	switch e.Verdict {
	case verdictAllow:
		return nil
	case verdictDepends:
		return errDepends
	case verdictRemote:
		return errRemote
	}
	return errDenied
}

// parseInterspersed parses flags anywhere among the arguments (flag stops
// at the first positional one) and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
