// Command waypoint benchmarks the L7 waypoint (cmd/waypoint) beside HAProxy
// in HTTP mode on the same loopback path and prints one figure per line as
// "name value unit" on stdout; details go to stderr.
//
//	go build -o bin/waypoint ./cmd/waypoint && go run ./bench/waypoint -waypoint bin/waypoint
//
// The load is HTTP/1.1, a 1 KiB POST answered with 1 KiB, at 1,000
// requests per second over 16 keep-alive connections, on three paths
// measured in the same run, in alternating rounds:
//
//   - direct: client → server app (the baseline "added" latency is
//     measured against);
//   - waypoint: client → HBONE with the client's workload identity → the
//     waypoint binary on 15008 (one AuthorizationPolicy ALLOW, one DENY and
//     one HTTPRoute rule in effect, from the control plane's translation of
//     the objects in cp.go, over real delta xDS and the CA) → HBONE with the
//     waypoint's identity → the server's HBONE terminator → app;
//   - haproxy_http: client → mTLS → HAProxy in HTTP mode with the same
//     rules → mTLS → the server's TLS terminator → app (haproxy.go says why
//     this is the equal path).
//
// Two more paths show what the tunnels alone add (client → HBONE
// terminator → app and client → TLS terminator → app). The waypoint,
// HAProxy and the server (app and terminators) are child processes; the
// CPU and memory figures are the proxy process's only, from /proc.
package main

import (
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

var (
	clientID = identity.MustNew("cluster.local", "bench", "client")
	serverID = identity.MustNew("cluster.local", "bench", "server")
	wpID     = identity.MustNew("cluster.local", "bench", "waypoint")
)

// msgSize is the request and response body.
const msgSize = 1024

type options struct {
	waypoint   string
	rounds     int
	duration   time.Duration
	conns      int
	rate       int
	hops       bool
	cpuProfile string
	logLevel   string
}

func main() {
	role := flag.String("role", "", "internal: the child role (server)")
	dir := flag.String("dir", "", "internal: the directory with the CA root (server role)")
	var o options
	flag.StringVar(&o.waypoint, "waypoint", "", "the cmd/waypoint binary (empty: built into a temporary directory)")
	flag.IntVar(&o.rounds, "rounds", 5, "rounds; each measures every path once, the proxies in alternating order")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "timed load per path per round")
	flag.IntVar(&o.conns, "conns", 16, "keep-alive client connections")
	flag.IntVar(&o.rate, "rate", 1000, "requests per second over all connections")
	flag.BoolVar(&o.hops, "hops", true, "also measure the two tunnels alone (client → terminator → app)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "after the rounds, one more waypoint load with its CPU profile written here")
	flag.StringVar(&o.logLevel, "waypoint-log-level", "info", "the waypoint's --log-level (info: one access-log line per request, as deployed)")
	flag.Parse()
	var err error
	switch *role {
	case "server":
		err = childServer(*dir)
	case "":
		err = run(o)
	default:
		err = fmt.Errorf("unknown -role %q", *role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench/waypoint: %v\n", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

func emit(name string, value float64, unit string) {
	prec := 2
	switch {
	case value >= 100 || value <= -100:
		prec = 0
	case unit == "vcpu":
		// Two places printed 0.11 for both 0.110 and 0.106: a 4 % gap
		// read as a tie.
		prec = 3
	}
	fmt.Printf("%s %s %s\n", name, strconv.FormatFloat(value, 'f', prec, 64), unit)
}

func run(o options) error {
	r := &benchkit.Reaper{}
	r.OnSignal("bench/waypoint")
	dir, err := r.TempDir("bench-waypoint-")
	if err != nil {
		return err
	}
	defer r.RemoveDir(dir)
	authority, err := ca.New(ca.Options{})
	if err != nil {
		return err
	}
	if err := benchkit.WriteCA(authority, dir); err != nil {
		return err
	}
	if o.waypoint == "" {
		o.waypoint = filepath.Join(dir, "waypoint")
		if out, err := exec.Command("go", "build", "-o", o.waypoint, "./cmd/waypoint").CombinedOutput(); err != nil {
			return fmt.Errorf("building cmd/waypoint (run from the repository root, or pass -waypoint): %w: %s", err, out)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	srv, _, err := benchkit.StartChild(r, exec.Command(exe, "-role", "server", "-dir", dir))
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	defer srv.Stop()
	cp, err := startControlPlane(authority, dir)
	if err != nil {
		return err
	}
	defer cp.stop()
	wp, err := startWaypoint(r, o, cp, dir)
	if err != nil {
		return err
	}
	defer wp.stop()
	haListen := fmt.Sprintf("%s:%d", wpIP, tlsPort)
	haPID, haStop, err := startHAProxy(r, authority, dir, haListen)
	if err != nil {
		return err
	}
	defer haStop()

	cc, err := authority.Issue(clientID, 24*time.Hour)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AddCert(authority.Root())
	cl, err := newClients(identity.NewStaticSource(cc), cc, roots)
	if err != nil {
		return err
	}
	defer cl.pool.Close()
	direct := &path{name: "direct", dial: plainDial(fmt.Sprintf("%s:%d", serverIP, appPort))}
	wpPath := &path{name: "waypoint", dial: cl.tunnel(wpIP+":15008", svcVIP+":80", wpID), pid: wp.pid, routed: true}
	haPath := &path{name: "haproxy_http", dial: cl.tlsDial(haListen), pid: haPID, routed: true}
	hops := []*path{
		{name: "hbone_hop", dial: cl.tunnel(serverIP+":15008", fmt.Sprintf("%s:%d", serverIP, appPort), serverID)},
		{name: "tls_hop", dial: cl.tlsDial(fmt.Sprintf("%s:%d", serverIP, tlsPort))},
	}
	if !o.hops {
		hops = nil
	}
	for _, p := range append([]*path{direct, wpPath, haPath}, hops...) {
		if err := check(p); err != nil {
			return fmt.Errorf("check: %w", err)
		}
	}
	logf("bench/waypoint: checked: through the waypoint (pid %d) and HAProxy (pid %d) POST %s answers 200 with the route's header, %s and GET %s answer 403",
		wp.pid, haPID, benchPath, deniedPath, benchPath)
	logf("bench/waypoint: %d rounds of %v per path, %d connections, %d req/s, %d B request and response; load average %s",
		o.rounds, o.duration, o.conns, o.rate, msgSize, loadAvg())

	for i := range o.rounds {
		order := []*path{direct, wpPath, haPath}
		if i%2 == 1 {
			order = []*path{direct, haPath, wpPath}
		}
		var line []string
		for _, p := range append(order, hops...) {
			rd, err := load(p, o.conns, o.rate, o.duration)
			if err != nil {
				return fmt.Errorf("round %d: %w", i, err)
			}
			p.rounds = append(p.rounds, rd)
			s := fmt.Sprintf("%s %.0f req/s p50/p90/p99 %.0f/%.0f/%.0f µs", p.name, rd.rate, us(rd.p50), us(rd.p90), us(rd.p99))
			if p.pid != 0 {
				s += fmt.Sprintf(" %.3f vCPU", rd.vcpu)
			}
			line = append(line, s)
		}
		logf("round %d: %s; load average %s", i, strings.Join(line, ", "), loadAvg())
	}

	emit("direct_latency_p50_us", benchkit.Median(pctls(direct, 50)), "us")
	emit("direct_latency_p90_us", benchkit.Median(pctls(direct, 90)), "us")
	emit("direct_latency_p99_us", benchkit.Median(pctls(direct, 99)), "us")
	for _, p := range append([]*path{wpPath, haPath}, hops...) {
		for _, q := range []float64{50, 90, 99} {
			emit(fmt.Sprintf("%s_added_latency_p%.0f_us", p.name, q), benchkit.Median(added(p, direct, q)), "us")
		}
		if p.pid == 0 {
			continue
		}
		var cpu []float64
		for _, rd := range p.rounds {
			cpu = append(cpu, rd.cpuPer1k())
		}
		logf("%s: vCPU per 1k req/s by round %s; VmRSS max %.1f MiB; %s", p.name, fmtFloats(cpu, 3), p.maxRSS, memLine(p.pid))
		emit(p.name+"_cpu_per_1k_rps", benchkit.Median(cpu), "vcpu")
		emit(p.name+"_rss_mb", p.maxRSS, "MB")
	}
	if o.cpuProfile != "" {
		if err := profileWaypoint(wpPath, wp, o); err != nil {
			return err
		}
	}
	return nil
}

// pctls is p's q-th percentile latency in each round, in µs.
func pctls(p *path, q float64) []float64 {
	var out []float64
	for _, rd := range p.rounds {
		out = append(out, us(pick(rd, q)))
	}
	return out
}

// added is p's q-th percentile minus direct's of the same round, in µs.
func added(p, direct *path, q float64) []float64 {
	var out []float64
	for i, rd := range p.rounds {
		out = append(out, us(pick(rd, q)-pick(direct.rounds[i], q)))
	}
	return out
}

func pick(rd round, q float64) time.Duration {
	switch q {
	case 50:
		return rd.p50
	case 90:
		return rd.p90
	}
	return rd.p99
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func fmtFloats(v []float64, prec int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatFloat(x, 'f', prec, 64)
	}
	return strings.Join(s, " / ")
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// memLine is pid's memory in MiB and threads from /proc/<pid>/status.
func memLine(pid int) string {
	st, err := benchkit.Status(pid)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("now VmRSS %.1f MiB (anon %.1f, file %.1f), VmHWM %.1f MiB, threads %d",
		float64(st["VmRSS"])/1024, float64(st["RssAnon"])/1024, float64(st["RssFile"])/1024, float64(st["VmHWM"])/1024, st["Threads"])
}

// waypointProc is the running cmd/waypoint.
type waypointProc struct {
	pid   int
	admin string // its admin server (pprof)
	stop  func()
}

// startWaypoint runs the waypoint binary for the Gateway bench/waypoint
// against the local control plane, with its log (one access-log line per
// request at info) in dir/waypoint.log, and waits for its readiness (first
// xDS sync and certificate).
func startWaypoint(r *benchkit.Reaper, o options, cp *controlPlane, dir string) (*waypointProc, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	ready, admin := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	logPath := filepath.Join(dir, "waypoint.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.waypoint,
		"--gateway", gatewayRef, "--xds-address", cp.addr, "--root-cert", cp.rootFile, "--token", cp.token,
		"--trust-domain", "cluster.local", "--service-account", "waypoint", "--pod-name", "waypoint",
		"--node-name", nodeName, "--ip", wpIP, "--listen", wpIP+":15008",
		"--metrics-addr", "", "--readiness-addr", ready, "--admin-addr", admin, "--log-level", o.logLevel)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting the waypoint: %w", err)
	}
	logFile.Close()
	r.Track(cmd.Process)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	w := &waypointProc{pid: cmd.Process.Pid, admin: admin}
	w.stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		r.Untrack(cmd.Process)
	}
	tail := func() string {
		b, _ := os.ReadFile(logPath)
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		return string(b)
	}
	deadline := time.Now().Add(30 * time.Second)
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get("http://" + ready + "/healthz/ready")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return w, nil
			}
		}
		select {
		case err := <-exited:
			exited <- err
			w.stop()
			return nil, fmt.Errorf("the waypoint exited before it was ready: %v; its log:\n%s", err, tail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			w.stop()
			return nil, fmt.Errorf("the waypoint is not ready after 30 s; its log:\n%s", tail())
		}
	}
}

// profileWaypoint runs one more waypoint load while the waypoint's own
// CPU profiler (admin /debug/pprof/profile) records it, and writes the
// profile to o.cpuProfile.
func profileWaypoint(p *path, w *waypointProc, o options) error {
	secs := max(1, int(o.duration/time.Second))
	done := make(chan error, 1)
	go func() {
		client := &http.Client{Timeout: time.Duration(secs+30) * time.Second}
		resp, err := client.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", w.admin, secs))
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			done <- fmt.Errorf("profile: status %d", resp.StatusCode)
			return
		}
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			done <- err
			return
		}
		_, err = io.Copy(f, resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		done <- err
	}()
	rd, err := load(p, o.conns, o.rate, o.duration+time.Second)
	if err != nil {
		return err
	}
	if err := <-done; err != nil {
		return fmt.Errorf("waypoint CPU profile: %w", err)
	}
	logf("waypoint CPU profile of one more load (%.0f req/s, %.3f vCPU) written to %s", rd.rate, rd.vcpu, o.cpuProfile)
	return nil
}

// freePorts returns n distinct free loopback ports (held open together so
// they differ, then released for the child to bind).
func freePorts(n int) ([]int, error) {
	var out []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
