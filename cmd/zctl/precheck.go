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
	"strings"
	"syscall"
	"text/tabwriter"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel-go/cni/agent/install"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
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
	Cluster string        `json:"cluster,omitempty"` // the API server, with --kubeconfig
	Checks  []checkResult `json:"checks"`
}

// nodeProbe is where the local checks look; the command uses the real
// paths, tests point them at temporary directories.
type nodeProbe struct {
	cniDir  string                       // the CNI conf dir (NETCONFPATH)
	proc    string                       // /proc
	modules string                       // /lib/modules/<release>
	look    func(string) (string, error) // exec.LookPath
	mode    func() rules.Mode            // rules.DetectMode, the node agent's choice
	version func(bin string) string      // `<bin> --version`
}

func realProbe(cniDir string) nodeProbe {
	var u unix.Utsname
	release := ""
	if unix.Uname(&u) == nil {
		release = unix.ByteSliceToString(u.Release[:])
	}
	return nodeProbe{cniDir: cniDir, proc: "/proc", modules: filepath.Join("/lib/modules", release), look: exec.LookPath,
		mode: rules.DetectMode, version: func(bin string) string {
			out, _ := exec.Command(bin, "--version").Output()
			return strings.TrimSpace(string(out))
		}}
}

// localChecks are the node's: CNI config, iptables, kernel features.
func (p nodeProbe) localChecks() []checkResult {
	out := []checkResult{p.cniCheck()}
	out = append(out, p.iptablesChecks()...)
	out = append(out,
		p.targetCheck("REDIRECT", "xt_REDIRECT", checkFail, "the in-pod capture rules redirect to the proxy with it"),
		p.targetCheck("TPROXY", "xt_TPROXY", checkWarn, "ztunnel-go's rules use REDIRECT; only TPROXY-based rule sets need it"),
		reusePortCheck(), p.migrateCheck())
	return out
}

func (p nodeProbe) cniCheck() checkResult {
	c := checkResult{Check: "CNI config"}
	if fi, err := os.Stat(p.cniDir); err != nil || !fi.IsDir() {
		c.Status, c.Detail = checkFail, fmt.Sprintf("%s: not a directory (%v)", p.cniDir, err)
		c.Fix = "install the pod network (primary CNI) first, or pass the runtime's NETCONFPATH as --cni-conf-dir"
		return c
	}
	f, err := install.PrimaryConfig(p.cniDir)
	if err != nil {
		c.Status, c.Detail = checkFail, err.Error()
		c.Fix = "the primary CNI has not written its config yet: wait for it, or check that --cni-conf-dir is the runtime's"
		return c
	}
	c.Status, c.Detail = checkOK, "the runtime uses "+f+" (lexically first config that parses)"
	if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), `"`+install.PluginType+`"`) {
		c.Detail += "; " + install.PluginType + " is already chained in it"
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
ztunnel-go: the CNI conf dir and the config file the runtime will use (the
node agent's own choice), the iptables variant the agent will pick and its
restore binaries, kernel features (REDIRECT and TPROXY targets, SO_REUSEPORT,
tcp_migrate_req), and in the cluster the CRDs the control plane watches and
the CA Secret and root ConfigMap. Each check prints OK, WARN or FAIL with a
fix; the exit status is 2 when one FAILs. It reads only.`

func runPrecheck(args []string, out io.Writer) error {
	var cniDir, kubeconfig, namespace, caSecret, format string
	s := newSub("precheck", "", precheckAbout, out)
	s.fs.StringVar(&cniDir, "cni-conf-dir", "/etc/cni/net.d", "the container runtime's CNI conf dir")
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
	r := precheckReport{Node: host, Checks: realProbe(cniDir).localChecks()}
	if kubeconfig != "" {
		cluster, checks, err := clusterChecks(kubeconfig, namespace, caSecret)
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
	fmt.Fprintf(w, "# node: %s (local checks)\n", r.Node)
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
