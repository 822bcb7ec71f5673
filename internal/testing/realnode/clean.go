package realnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// recordPid appends "name pid starttime" to pidFile. The start time (field
// 22 of /proc/pid/stat) keeps Clean from killing a reused pid.
func recordPid(name string, pid int) error {
	st, err := startTime(pid)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(pidFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "%s %d %s\n", name, pid, st)
	return err
}

func startTime(pid int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// comm (field 2) may hold spaces; fields after the last ')' are fixed.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("pid %d: bad stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", fmt.Errorf("pid %d: short stat", pid)
	}
	return f[19], nil
}

// Clean removes everything a node run creates, whether that run is this
// process's or one that was killed: safe to call when nothing is there.
func Clean(logf func(string, ...any)) error {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// 1. Processes: the kubelet first (so it restarts nothing), then every
	// process in the pods' cgroups, containerd's shims for our socket, and
	// the rest of what pidFile names.
	recorded := readPids()
	killRecorded(recorded, "kubelet")
	killPodCgroups()
	killShims()
	killRecorded(recorded, "")
	_ = os.Remove(pidFile)

	// 2. Mounts under our directories and the CRI's network namespaces.
	note(unmountUnder(BaseDir, RunDir, "/run/containerd/io.containerd.runtime.v2.task/"+ctrNamespace, "/run/netns/cni-"))
	if ms, _ := filepath.Glob("/run/netns/cni-*"); len(ms) > 0 {
		for _, m := range ms {
			_ = os.Remove(m)
		}
	}
	// containerd 1.6 keeps its shims' sockets and runc's state here
	// whatever its configured state directory.
	_ = os.RemoveAll("/run/containerd/runc/" + ctrNamespace)
	_ = os.RemoveAll("/run/containerd/io.containerd.runtime.v2.task/" + ctrNamespace)
	removeCgroups()

	// 3. Network: the bridge (its veths went with the pods' namespaces),
	// iptables chains of kube-proxy, the kubelet, the bridge plugin's
	// masquerading and our agent's host probe rule.
	if exec.Command("ip", "link", "show", Bridge).Run() == nil {
		if out, err := exec.Command("ip", "link", "del", Bridge).CombinedOutput(); err != nil {
			note(fmt.Errorf("ip link del %s: %w: %s", Bridge, err, out))
		}
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		note(cleanIptables(fam))
	}
	for _, set := range []string{"istio-inpod-probes-v4", "istio-inpod-probes-v6"} {
		_ = exec.Command("ipset", "destroy", set).Run()
	}

	// 4. Host state: sysctls, directories the chart's hostPaths created.
	note(restoreSysctls())
	removeCreatedHostDirs()
	if links, _ := filepath.Glob("/var/log/containers/*.log"); len(links) > 0 {
		for _, l := range links {
			if dst, err := os.Readlink(l); err == nil && strings.HasPrefix(dst, podLogsDir+"/") {
				_ = os.Remove(l)
			}
		}
	}
	note(os.RemoveAll(RunDir))
	note(os.RemoveAll(BaseDir))
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	logf("realnode: clean")
	return nil
}

type pidRec struct {
	name, start string
	pid         int
}

func readPids() []pidRec {
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return nil
	}
	var out []pidRec
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		out = append(out, pidRec{f[0], f[2], pid})
	}
	return out
}

// killRecorded kills the recorded processes named only (all when empty)
// that still run with their recorded start time, and waits for them.
func killRecorded(recs []pidRec, only string) {
	var pids []int
	for _, r := range recs {
		if only != "" && r.name != only {
			continue
		}
		if st, err := startTime(r.pid); err == nil && st == r.start {
			_ = syscall.Kill(r.pid, syscall.SIGKILL)
			pids = append(pids, r.pid)
		}
	}
	waitGone(pids)
}

func waitGone(pids []int) {
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for time.Now().Before(deadline) {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
				break
			}
			// A child of ours stays a zombie until reaped by its Wait.
			if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); strings.Contains(string(st), ") Z ") {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// podCgroupDirs are the kubelet's cgroupfs trees (cgroupsPerQOS) in every
// v1 hierarchy, deepest first.
func podCgroupDirs() []string {
	var dirs []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	for _, r := range roots {
		_ = filepath.WalkDir(r, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	return dirs
}

// killPodCgroups kills every process in the pods' cgroups (the containers
// the kubelet started through containerd) until none is left.
func killPodCgroups() {
	for range 50 {
		var pids []int
		for _, d := range podCgroupDirs() {
			data, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			if err != nil {
				continue
			}
			for _, l := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(l); err == nil {
					pids = append(pids, pid)
				}
			}
		}
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killShims kills containerd-shim-runc-v2 processes serving our containerd.
func killShims() {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, c := range procs {
		data, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		args := strings.Split(string(data), "\x00")
		if len(args) == 0 || !strings.HasSuffix(args[0], "containerd-shim-runc-v2") {
			continue
		}
		if !strings.Contains(string(data), containerdSocket) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(c)))
		if err != nil {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		pids = append(pids, pid)
	}
	waitGone(pids)
}

func removeCgroups() {
	for _, d := range podCgroupDirs() {
		_ = syscall.Rmdir(d)
	}
}

// unmountUnder detaches every mount at or below the prefixes, deepest first.
func unmountUnder(prefixes ...string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, p := range prefixes {
			if mp == p || strings.HasPrefix(mp, strings.TrimSuffix(p, "/")+"/") || (strings.HasSuffix(p, "-") && strings.HasPrefix(mp, p)) {
				points = append(points, mp)
				break
			}
		}
	}
	f.Close()
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, mp := range points {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("umount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// cleanIptables removes, in every table of one family, the rules that jump
// to or carry the comments of our chains (KUBE-*, the bridge plugin's CNI-*
// for our network, the agent's ISTIO_*), then flushes and deletes those
// chains. kube-proxy --cleanup leaves KUBE-FIREWALL, KUBE-KUBELET-CANARY
// and KUBE-IPTABLES-HINT, which the kubelet makes, so this does it all.
func cleanIptables(fam string) error {
	if _, err := exec.LookPath(fam + "-save"); err != nil {
		return nil
	}
	out, err := exec.Command(fam + "-save").Output()
	if err != nil {
		return fmt.Errorf("%s-save: %w", fam, err)
	}
	ours := func(chain string) bool {
		return strings.HasPrefix(chain, "KUBE-") || strings.HasPrefix(chain, "ISTIO_")
	}
	var errs []error
	table := ""
	var chains []string
	var dels [][]string
	cniChains := map[string]bool{}
	flushTable := func() {
		for _, d := range dels {
			if o, err := exec.Command(fam, append([]string{"-t", table, "-D"}, d...)...).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -t %s -D %v: %w: %s", fam, table, d, err, o))
			}
		}
		for _, c := range chains {
			_ = exec.Command(fam, "-t", table, "-F", c).Run()
		}
		for _, c := range chains {
			if o, err := exec.Command(fam, "-t", table, "-X", c).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -t %s -X %s: %w: %s", fam, table, c, err, o))
			}
		}
		chains, dels = nil, nil
	}
	lines := strings.Split(string(out), "\n")
	// First pass: the CNI-* chains whose rules carry our network's name.
	for _, l := range lines {
		if strings.HasPrefix(l, "-A CNI-") && strings.Contains(l, `name: \"`+NetworkName+`\"`) {
			cniChains[strings.Fields(l)[1]] = true
		}
	}
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, ":"):
			c := strings.Fields(l[1:])[0]
			if ours(c) || cniChains[c] {
				chains = append(chains, c)
			}
		case strings.HasPrefix(l, "-A "):
			f := strings.Fields(l)
			chain := f[1]
			if ours(chain) || cniChains[chain] {
				continue // goes with its chain
			}
			target := ""
			for i := range f {
				if (f[i] == "-j" || f[i] == "-g") && i+1 < len(f) {
					target = f[i+1]
				}
			}
			if ours(target) || cniChains[target] || strings.Contains(l, `name: \"`+NetworkName+`\"`) {
				spec, err := splitRule(strings.TrimPrefix(l, "-A "))
				if err != nil {
					errs = append(errs, err)
					continue
				}
				dels = append(dels, spec)
			}
		case l == "COMMIT":
			flushTable()
		}
	}
	return errors.Join(errs...)
}

// splitRule splits an iptables-save rule into arguments, honouring its
// double-quoted, backslash-escaped strings (comments).
func splitRule(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in, have := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && in && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			in, have = !in, true
		case c == ' ' && !in:
			if have || cur.Len() > 0 {
				out = append(out, cur.String())
			}
			cur.Reset()
			have = false
		default:
			cur.WriteByte(c)
		}
	}
	if in {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if have || cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out, nil
}

// saveSysctls records the host's values before the first run; a file left
// by a killed run is kept (it holds the true originals).
func saveSysctls() error {
	if _, err := os.Stat(sysctlFile); err == nil {
		return nil
	}
	var b strings.Builder
	for _, k := range sysctls {
		v, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "%s %s\n", k, strings.TrimSpace(string(v)))
	}
	return os.WriteFile(sysctlFile, []byte(b.String()), 0o644)
}

func restoreSysctls() error {
	data, err := os.ReadFile(sysctlFile)
	if err != nil {
		return nil
	}
	var errs []error
	for _, l := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(l, " ")
		if !ok {
			continue
		}
		cur, err := os.ReadFile("/proc/sys/" + k)
		if err != nil || strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("sysctl %s=%s: %w", k, v, err))
		}
	}
	if len(errs) == 0 {
		_ = os.Remove(sysctlFile)
	}
	return errors.Join(errs...)
}

// recordHostDirs notes which chart hostPath directories do not exist yet.
func recordHostDirs() error {
	if _, err := os.Stat(createdDirsFile); err == nil {
		return nil
	}
	var b strings.Builder
	for _, d := range hostDirs {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			fmt.Fprintln(&b, d)
		}
	}
	return os.WriteFile(createdDirsFile, []byte(b.String()), 0o644)
}

func removeCreatedHostDirs() {
	data, err := os.ReadFile(createdDirsFile)
	if err != nil {
		return
	}
	for _, d := range strings.Fields(string(data)) {
		_ = os.RemoveAll(d)
	}
}

// drainPods deletes every pod and waits (bounded by ctx) until the kubelet
// has stopped their sandboxes, so the CNI chain's DEL runs as in a cluster.
func (n *Node) drainPods(ctx context.Context) {
	nss, err := n.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	zero := int64(0)
	for _, ns := range nss.Items {
		_ = n.Client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}
	for ctx.Err() == nil {
		out, err := Ctr(ctx, "tasks", "ls", "-q")
		if err != nil || strings.TrimSpace(out) == "" {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitNodeReady waits for the Node to be Ready and the default
// ServiceAccount (made by the controller manager) to exist.
func (n *Node) waitNodeReady(ctx context.Context, kubelet *proc) error {
	return waitFor(ctx, 120*time.Second, kubelet, func() error {
		node, err := n.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := false
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if !ready {
			return fmt.Errorf("node %s not Ready", NodeName)
		}
		_, err = n.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}
