package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel-go/cni/agent/install"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/cni/runtimecfg"
)

// Check results.
const (
	checkOK   = "OK"
	checkWarn = "WARN"
	checkFail = "FAIL"
)

// errChecksFailed: a precheck FAILed (exit 2, as analyze's error findings).
var errChecksFailed = fmt.Errorf("precheck failed: %w", errFindings)

// checkResult is one line of zctl precheck.
type checkResult struct {
	Check  string `json:"check"`
	Status string `json:"status"` // OK, WARN or FAIL
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"` // what to do when not OK
}

// precheckReport is what zctl precheck prints.
type precheckReport struct {
	Node    string        `json:"node"`              // the host the local checks ran on
	Phase   string        `json:"phase"`             // "before install" or "after install"
	Cluster string        `json:"cluster,omitempty"` // the API server, with --kubeconfig
	Checks  []checkResult `json:"checks"`
}

// nodeProbe is where the local checks look; the command uses the real
// paths, tests point them at temporary directories.
type nodeProbe struct {
	// cniDir and binDir are the CNI conf and bin dirs given by flag; ""
	// means the container runtime's (read through runtime, as the node
	// agent reads it).
	cniDir, binDir string
	runtime        runtimecfg.Options
	// after: the chart is installed, so the plugin must be chained.
	after bool
	// offNode: a cluster is checked too, so this machine may be no node:
	// a missing container runtime only WARNs.
	offNode bool
	proc    string                       // /proc
	modules string                       // /lib/modules/<release>
	look    func(string) (string, error) // exec.LookPath
	mode    func() rules.Mode            // rules.DetectMode, the node agent's choice
	version func(bin string) string      // `<bin> --version`
}

func realProbe(cniDir, binDir string) nodeProbe {
	var u unix.Utsname
	release := ""
	if unix.Uname(&u) == nil {
		release = unix.ByteSliceToString(u.Release[:])
	}
	return nodeProbe{cniDir: cniDir, binDir: binDir, proc: "/proc", modules: filepath.Join("/lib/modules", release), look: exec.LookPath,
		mode: rules.DetectMode, version: func(bin string) string {
			out, _ := exec.Command(bin, "--version").Output()
			return strings.TrimSpace(string(out))
		}}
}

// localChecks are the node's: the runtime's CNI directories and config,
// iptables, kernel features.
func (p nodeProbe) localChecks() []checkResult {
	rt, bin, conf := p.runtimeCheck()
	out := []checkResult{rt}
	// The directories are the host's; tests read a fake host under Root.
	if bin != "" {
		out = append(out, p.binDirCheck(filepath.Join("/", p.runtime.Root, bin)))
	}
	if conf != "" {
		p.cniDir = filepath.Join("/", p.runtime.Root, conf)
		out = append(out, p.cniCheck())
	}
	out = append(out, p.iptablesChecks()...)
	out = append(out,
		p.targetCheck("REDIRECT", "xt_REDIRECT", checkFail, "the in-pod capture rules redirect to the proxy with it"),
		p.targetCheck("TPROXY", "xt_TPROXY", checkWarn, "ztunnel-go's rules use REDIRECT; only TPROXY-based rule sets need it"),
		reusePortCheck(), p.migrateCheck())
	return out
}

// runtimeCheck reads the container runtime's configuration as the node
// agent does (cni/runtimecfg) and returns the CNI bin and conf dirs to
// check: the flags' where given, else the runtime's ("" when unknown).
func (p nodeProbe) runtimeCheck() (c checkResult, bin, conf string) {
	c = checkResult{Check: "container runtime"}
	bin, conf = p.binDir, p.cniDir
	d, err := runtimecfg.Detect(p.runtime)
	switch {
	case err != nil && bin != "" && conf != "":
		c.Status, c.Detail = checkWarn, err.Error()
		c.Fix = "the flags' directories are checked instead; make sure they are the runtime's"
	case err != nil && p.offNode:
		c.Status, c.Detail = checkWarn, err.Error()+"; node checks skipped"
		c.Fix = "run zctl precheck on each node for its checks (this machine runs no container runtime)"
		return c, "", ""
	case err != nil:
		c.Status, c.Detail = checkFail, err.Error()
		c.Fix = "run precheck on a node; if its runtime's configuration is elsewhere, set the chart values cni.cniBinDir " +
			"and cni.cniConfDir (and pass --cni-bin-dir/--cni-conf-dir here)"
	default:
		c.Status, c.Detail = checkOK, d.String()
		if d.Socket != "" {
			c.Detail += "; CRI socket " + d.Socket
			if d.Runtime == runtimecfg.Containerd {
				c.Detail += " (ctr -a " + d.Socket + " -n k8s.io images import ...)"
			}
		}
		var differ []string
		if bin != "" && !slices.Contains(d.BinDirs, bin) {
			differ = append(differ, "bin dir "+bin)
		}
		if conf != "" && conf != d.ConfDir {
			differ = append(differ, "conf dir "+conf)
		}
		if len(differ) > 0 {
			c.Status = checkWarn
			c.Detail += "; the flags name " + strings.Join(differ, " and ") + ", which the runtime does not use"
			c.Fix = "leave the chart values cni.cniBinDir/cni.cniConfDir unset (the agent reads the runtime's), or set them to the runtime's"
		}
		if bin == "" {
			bin = d.BinDir()
		}
		if conf == "" {
			conf = d.ConfDir
		}
	}
	return c, bin, conf
}

// binDirCheck: the bin dir the plugin goes into (after the install, with
// the plugin in it).
func (p nodeProbe) binDirCheck(dir string) checkResult {
	c := checkResult{Check: "CNI bin dir"}
	fi, err := os.Stat(dir)
	switch {
	case err != nil || !fi.IsDir():
		c.Status, c.Detail = checkWarn, fmt.Sprintf("%s: not a directory (%v)", dir, err)
		c.Fix = "the primary CNI's plugins must be in it; the node agent creates it for its own"
		if p.after {
			c.Status = checkFail
			c.Fix = "the node agent did not install its plugin: see its log (kubectl -n istio-system logs ds/ztunnel-cni)"
		}
	case p.after:
		if _, err := os.Stat(filepath.Join(dir, install.PluginType)); err != nil {
			c.Status, c.Detail = checkFail, "no "+install.PluginType+" in "+dir
			c.Fix = "the node agent did not install its plugin: see its log (kubectl -n istio-system logs ds/ztunnel-cni)"
			return c
		}
		c.Status, c.Detail = checkOK, install.PluginType+" installed in "+dir
	default:
		c.Status, c.Detail = checkOK, dir+" (the node agent copies "+install.PluginType+" into it)"
	}
	return c
}

func (p nodeProbe) cniCheck() checkResult {
	c := checkResult{Check: "CNI config"}
	if fi, err := os.Stat(p.cniDir); err != nil || !fi.IsDir() {
		c.Status, c.Detail = checkFail, fmt.Sprintf("%s: not a directory (%v)", p.cniDir, err)
		c.Fix = "install the pod network (primary CNI) first: the runtime reads its config from this directory"
		return c
	}
	f, err := install.PrimaryConfig(p.cniDir)
	if err != nil {
		c.Status, c.Detail = checkFail, err.Error()
		c.Fix = "the primary CNI has not written its config yet: wait for it, or check that the directory is the runtime's"
		return c
	}
	c.Status, c.Detail = checkOK, "the runtime uses "+f+" (lexically first config that parses)"
	chained := false
	if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), `"`+install.PluginType+`"`) {
		chained = true
		c.Detail += "; " + install.PluginType + " is chained in it"
	}
	if p.after && !chained {
		c.Status = checkFail
		c.Detail += "; " + install.PluginType + " is not chained in it: new ambient pods are not captured"
		c.Fix = "the node agent is not installing its plugin: see its log (kubectl -n istio-system logs ds/ztunnel-cni)"
	}
	return c
}

func (p nodeProbe) iptablesChecks() []checkResult {
	mode := p.mode()
	suffix, backend := "", string(mode)+": that variant holds more rules, so the node agent picks it"
	if mode != rules.ModeDefault {
		suffix = "-" + string(mode)
	} else {
		backend = "default: neither variant holds more rules, so the node agent runs iptables from PATH"
		if v := p.version("iptables"); strings.Contains(v, "nf_tables") {
			backend += " (nf_tables)"
		} else if strings.Contains(v, "legacy") {
			backend += " (legacy)"
		}
	}
	out := []checkResult{{Check: "iptables backend", Status: checkOK, Detail: backend}}
	for _, b := range []struct{ name, status, fix string }{
		{"iptables" + suffix + "-restore", checkFail, "install the iptables package (the node agent writes pod rules with it)"},
		{"ip6tables" + suffix + "-restore", checkWarn, "install ip6tables for IPv6 pods (IPv4-only rule sets work without it)"},
	} {
		c := checkResult{Check: b.name}
		if path, err := p.look(b.name); err != nil {
			c.Status, c.Detail, c.Fix = b.status, "not found in PATH", b.fix
		} else {
			c.Status, c.Detail = checkOK, path
		}
		out = append(out, c)
	}
	return out
}

// targetCheck looks for an iptables target in /proc/net/ip_tables_targets
// (registered now), then for its module (loadable on first use).
func (p nodeProbe) targetCheck(target, module, missing, why string) checkResult {
	c := checkResult{Check: target + " target"}
	if b, err := os.ReadFile(filepath.Join(p.proc, "net", "ip_tables_targets")); err == nil && hasLine(string(b), target) {
		c.Status, c.Detail = checkOK, "registered (/proc/net/ip_tables_targets)"
		return c
	}
	found, known := false, false
	for _, f := range []string{"modules.builtin", "modules.dep"} {
		if b, err := os.ReadFile(filepath.Join(p.modules, f)); err == nil {
			known = true
			found = found || strings.Contains(string(b), "/"+module+".ko")
		}
	}
	switch {
	case found:
		c.Status, c.Detail = checkOK, module+" is available in "+p.modules+" (loaded on first use)"
	case !known:
		c.Status, c.Detail = checkWarn, "not registered, and "+p.modules+" cannot be read to find "+module
		c.Fix = "modprobe " + module + " (" + why + ")"
	default:
		c.Status, c.Detail = missing, "not registered and no "+module+" module in "+p.modules
		c.Fix = "build the kernel with " + module + " (" + why + ")"
	}
	return c
}

func hasLine(s, line string) bool {
	for l := range strings.Lines(s) {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// reusePortCheck binds two listeners to one port with SO_REUSEPORT, as a
// restarted node proxy binds beside the old one.
func reusePortCheck() checkResult {
	c := checkResult{Check: "SO_REUSEPORT"}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) }); err != nil {
			return err
		}
		return serr
	}}
	a, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err == nil {
		defer a.Close()
		var b net.Listener
		if b, err = lc.Listen(context.Background(), "tcp", a.Addr().String()); err == nil {
			b.Close()
			c.Status, c.Detail = checkOK, "two listeners shared "+a.Addr().String()
			return c
		}
	}
	c.Status, c.Detail = checkFail, err.Error()
	c.Fix = "a kernel with SO_REUSEPORT (3.9+) is needed for restarts without dropping connections"
	return c
}

func (p nodeProbe) migrateCheck() checkResult {
	c := checkResult{Check: "tcp_migrate_req"}
	b, err := os.ReadFile(filepath.Join(p.proc, "sys", "net", "ipv4", "tcp_migrate_req"))
	if err != nil {
		c.Status, c.Detail = checkWarn, "net.ipv4.tcp_migrate_req is missing (kernel before 5.14?)"
		if !errors.Is(err, os.ErrNotExist) {
			c.Detail = err.Error()
		}
		c.Fix = "upgrade to Linux 5.14+: without it a proxy restart resets connections still queued on the old listener"
		return c
	}
	c.Status = checkOK
	c.Detail = "supported (host value " + strings.TrimSpace(string(b)) + "; the proxy turns it on in each pod's namespace)"
	return c
}

const precheckAbout = `Checks whether this node (and, with --kubeconfig, the cluster) can run
ztunnel-go. Before the install (the default): the container runtime's CNI
directories, read from its own configuration as the node agent reads them
(containerd's CRI cni section, CRI-O's [crio.network]), the config file the
runtime will use, the iptables variant the agent will pick and its restore
binaries, kernel features (REDIRECT and TPROXY targets, SO_REUSEPORT,
tcp_migrate_req), and in the cluster the API server's version, Gateway API's
CRDs and the CA Secret; Istio's CRDs may still be missing, helm install adds
them. With --after-install: the plugin installed and chained on this node,
every CRD the control plane watches, the root ConfigMap, and the node agent
and node proxy Ready on every node. Each check prints OK, WARN or FAIL with a
fix; the exit status is 2 when one FAILs. It reads only.`

func runPrecheck(args []string, out io.Writer) error {
	var cniDir, binDir, kubeconfig, namespace, caSecret, format string
	var after bool
	s := newSub("precheck", "", precheckAbout, out)
	s.fs.StringVar(&cniDir, "cni-conf-dir", "", "the CNI conf dir to check (default: the one the container runtime's configuration names)")
	s.fs.StringVar(&binDir, "cni-bin-dir", "", "the CNI bin dir to check (default: the one the container runtime's configuration names)")
	s.fs.BoolVar(&after, "after-install", false, "check an installed mesh: the plugin chained here, every CRD, the root ConfigMap, the agents and node proxies Ready")
	s.fs.StringVar(&kubeconfig, "kubeconfig", "", "also check the cluster this kubeconfig points at")
	s.fs.StringVar(&namespace, "namespace", "istio-system", "the mesh's system namespace (the chart's release namespace)")
	s.fs.StringVar(&caSecret, "ca-secret", "ztunnel-go-ca", "the CA Secret (chart value controlPlane.caSecret)")
	s.format(&format)
	pos, err := s.parse(args, &format)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		s.fs.Usage()
		return fmt.Errorf("precheck takes no arguments, got %q", pos)
	}
	host, _ := os.Hostname()
	probe := realProbe(cniDir, binDir)
	probe.after, probe.offNode = after, kubeconfig != ""
	r := precheckReport{Node: host, Phase: "before install", Checks: probe.localChecks()}
	if after {
		r.Phase = "after install"
	}
	if kubeconfig != "" {
		cluster, checks, err := clusterChecks(kubeconfig, namespace, caSecret, after)
		if err != nil {
			return err
		}
		r.Cluster, r.Checks = cluster, append(r.Checks, checks...)
	}
	if err := writeData(out, format, r, func() error { return precheckTable(out, r) }); err != nil {
		return err
	}
	for _, c := range r.Checks {
		if c.Status == checkFail {
			return errChecksFailed
		}
	}
	return nil
}

func precheckTable(w io.Writer, r precheckReport) error {
	fmt.Fprintf(w, "# node: %s (local checks, %s)\n", r.Node, r.Phase)
	if r.Cluster != "" {
		fmt.Fprintf(w, "# cluster: %s\n", r.Cluster)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL\tFIX")
	for _, c := range r.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Check, c.Status, c.Detail, or(c.Fix, "-"))
	}
	return tw.Flush()
}
