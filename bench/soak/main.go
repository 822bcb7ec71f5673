// Command soak holds many concurrent tunnels open through the mesh, in
// waves, for a set duration, and watches the node proxies for leaks. It
// prints one figure per line as "name value unit" on stdout; progress and
// raw samples go to stderr.
//
//	go run ./bench/soak [-duration 10m] [-tunnels 10000] [-bin-dir bin]
//
// The topology is meshlab's two-node namespace cluster with the real
// ztunnel-cp, ztunnel-cni and ztunnel binaries: -clients captured client pods
// on node0 (namespace soak, ambient) and one captured server pod on node1
// running an echo server (this program again, -echo-server). Every connection a client pod opens to the
// server pod's IP is captured by node0's proxy (in-pod outbound), carried
// over HBONE to node1's proxy (inbound) and dialled to the echo server in
// the server pod. A wave opens -tunnels such connections (each one echoes
// -bytes of its own pattern and checks them), holds them all open for
// -hold (echoing once more on every one of them), closes them all and
// waits until both proxies report no open sockets; waves repeat until
// -duration has passed. Meanwhile both proxies' VmRSS (/proc) and
// goroutine count (go_goroutines on their stats port) are sampled.
//
// Figures:
//
//	soak_errors                 connections that failed or echoed wrong bytes
//	soak_rss_slope_kb_per_min   least-squares slope of VmRSS at rest: read
//	                            at the end of each gap, right before the
//	                            next wave opens, from the second wave on;
//	                            the larger of the two node proxies
//	soak_rss_anon_slope_kb_per_min
//	                            the same fit of VmRSS less RssFile: without
//	                            the executable's pages, which come back as
//	                            code first runs after the start-up release
//	soak_rss_all_samples_slope_kb_per_min
//	                            the same fit through every sample from the
//	                            end of wave 1 to the end of the last wave
//	soak_goroutines_baseline    both proxies' goroutines before the first wave
//	soak_goroutines_end         the same after the last wave and a settle
//	soak_live_heap_growth_kb    Go heap in use after two forced GCs, end minus
//	                            baseline, the larger of the two proxies
//	soak_waves                  waves run
//	soak_peak_tunnels           tunnels open at once at the highest peak, as
//	                            both proxies' istio_tcp_sockets_open agree
//	metrics_series_end          istio_* series both node proxies export after
//	                            the settle (issue 27's cardinality figure; the
//	                            soak's client pods are fixed, so it bounds what
//	                            tunnel churn leaves, not workload churn)
//
// Pooled HBONE connections outlive their last stream by the pool's idle
// timeout, which is state, not a leak: the proxies run with
// POOL_UNUSED_RELEASE_TIMEOUT=-pool-idle (set in this process's
// environment, which the children inherit) and the settle waits up to
// -pool-idle plus -settle for the goroutines to come back. When they do not,
// the goroutine stacks that grew since the baseline are printed to stderr.
//
// It needs root, the CNI tools (`make tools`) and the binaries (`make
// build`, or none: meshlab builds them). Run it under `flock /tmp/e2e.lock`,
// like every namespace benchmark. It is not a test: it asserts nothing
// beyond the setup working; a run with errors exits 1 after printing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// config is the command line.
type config struct {
	binDir   string
	duration time.Duration
	tunnels  int
	clients  int
	dialers  int
	bytes    int
	hold     time.Duration
	gap      time.Duration
	sample   time.Duration
	settle   time.Duration
	poolIdle time.Duration
	logLevel string
	profile  string

	churn        int
	churnPar     int
	metricsGrace time.Duration
}

// echoPort is the echo server's port in the server pod.
const echoPort = 7000

func main() {
	var cfg config
	flag.StringVar(&cfg.binDir, "bin-dir", "", "directory with prebuilt ztunnel, ztunnel-cni, ztunnel-cp, waypoint (empty: go build them)")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Minute, "run waves until this much time has passed (a wave started runs to its end)")
	flag.IntVar(&cfg.tunnels, "tunnels", 10000, "concurrent tunnels at the peak of each wave")
	flag.IntVar(&cfg.clients, "clients", 8, "client pods on node0 the tunnels are spread over")
	flag.IntVar(&cfg.dialers, "dialers", 64, "connections opened (and echoed) in parallel")
	flag.IntVar(&cfg.bytes, "bytes", 1024, "bytes each connection echoes, twice per wave")
	flag.DurationVar(&cfg.hold, "hold", 10*time.Second, "how long each wave holds all its tunnels open at the peak")
	flag.DurationVar(&cfg.gap, "gap", 3*time.Second, "pause between one wave's close and the next wave")
	flag.DurationVar(&cfg.sample, "sample", time.Second, "RSS and goroutine sampling interval")
	flag.DurationVar(&cfg.settle, "settle", 15*time.Second, "after the last wave (and -pool-idle), how long goroutines may take to come back to the baseline")
	flag.DurationVar(&cfg.poolIdle, "pool-idle", 10*time.Second, "the proxies' POOL_UNUSED_RELEASE_TIMEOUT (idle HBONE connections close after it)")
	flag.StringVar(&cfg.logLevel, "log-level", "warn", "the node proxies' log level once the mesh is up (info logs every connection)")
	flag.StringVar(&cfg.profile, "profile", "", "write both proxies' goroutine and heap profiles at the baseline, the last peak and the end into this directory")
	flag.IntVar(&cfg.churn, "churn", 0, "after the waves, this many short-lived client pods (a new workload each) open one tunnel each (0: none)")
	flag.IntVar(&cfg.churnPar, "churn-parallel", 4, "churned pods alive at once")
	flag.DurationVar(&cfg.metricsGrace, "metrics-grace", 30*time.Second, "with -churn, the proxies' METRICS_DELETED_WORKLOAD_GRACE")
	echoAddr := flag.String("echo-server", "", "internal: run as the echo server on this address (the soak starts it in the server pod)")
	flag.Parse()
	if *echoAddr != "" {
		os.Exit(serveEcho(*echoAddr))
	}
	if cfg.tunnels < 1 || cfg.clients < 1 || cfg.dialers < 1 || cfg.bytes < 1 || cfg.sample <= 0 {
		fmt.Fprintln(os.Stderr, "bench/soak: -tunnels, -clients, -dialers, -bytes and -sample must be positive")
		os.Exit(2)
	}
	if cfg.churn < 0 || cfg.churnPar < 1 || cfg.metricsGrace <= 0 {
		fmt.Fprintln(os.Stderr, "bench/soak: -churn must not be negative, -churn-parallel and -metrics-grace must be positive")
		os.Exit(2)
	}
	if cfg.clients+cfg.churnPar > testcluster.MaxPodsPerNode-2 {
		fmt.Fprintf(os.Stderr, "bench/soak: at most %d client pods, churned ones at once included\n", testcluster.MaxPodsPerNode-2)
		os.Exit(2)
	}

	prog := testkit.NewProgram("bench-soak", os.Stderr)
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigc
		logf("interrupted: tearing down")
		prog.Close()
		os.Exit(130)
	}()

	start := time.Now()
	s := &soak{cfg: cfg, prog: prog}
	err := func() (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = fmt.Errorf("panic: %v", v)
			}
		}()
		return s.run()
	}()
	prog.Close()
	logf("total %v (teardown included)", time.Since(start).Round(100*time.Millisecond))
	switch {
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench/soak:", err)
		os.Exit(1)
	case prog.Failed(), s.errors.total() > 0:
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().UTC().Format("15:04:05 ")+format+"\n", args...)
}

func emit(name string, value float64, unit string) {
	prec := 0
	if value != float64(int64(value)) {
		prec = 1
	}
	fmt.Printf("%s %s %s\n", name, strconv.FormatFloat(value, 'f', prec, 64), unit)
}

// soak is one run.
type soak struct {
	cfg  config
	prog *testkit.Program

	m       *meshlab.Mesh
	clients []*testcluster.Pod
	server  *testcluster.Pod
	dst     netip.AddrPort

	errors errorLog
	watch  *watcher
}

func (s *soak) run() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces)")
	}
	logf("machine: nproc=%d, loadavg=%s; %d tunnels over %d client pods, %v", runtime.NumCPU(), loadAvg(), s.cfg.tunnels, s.cfg.clients, s.cfg.duration)
	if err := raiseNoFile(s.cfg.tunnels); err != nil {
		return err
	}
	t0 := time.Now()
	if err := s.setup(); err != nil {
		return err
	}
	logf("setup %v", time.Since(t0).Round(100*time.Millisecond))

	w, err := newWatcher(s.m, s.cfg)
	if err != nil {
		return err
	}
	s.watch = w
	defer w.stop()
	base, err := w.baseline()
	if err != nil {
		return err
	}
	logf("baseline: goroutines %v, VmRSS %v KiB", base.goroutines, base.rssKB)

	begin := time.Now()
	var waves, peak int
	var waveEnds []time.Time
	var rests []sample
	for waves == 0 || time.Since(begin) < s.cfg.duration {
		if err := w.alive(); err != nil {
			return err
		}
		if waves > 0 {
			r, err := w.read()
			if err != nil {
				return err
			}
			logf("before wave %d, at rest: VmRSS %d / %d KiB (file-backed %d / %d), Go heap in use %d / %d KiB, retained %d / %d KiB, stacks %d / %d KiB",
				waves+1, r.rssKB[0], r.rssKB[1], r.fileKB[0], r.fileKB[1],
				r.heapInuse[0], r.heapInuse[1], r.heapRetained[0], r.heapRetained[1], r.stacks[0], r.stacks[1])
			rests = append(rests, r)
		}
		waves++
		r, err := s.wave(waves)
		if err != nil {
			return err
		}
		peak = max(peak, r.peak)
		waveEnds = append(waveEnds, time.Now())
		w.mark(waves)
		if time.Since(begin) < s.cfg.duration {
			time.Sleep(s.cfg.gap)
		}
	}
	logf("%d waves in %v; settling (pool idle %v + up to %v)", waves, time.Since(begin).Round(time.Second), s.cfg.poolIdle, s.cfg.settle)
	end, err := w.settle(base, s.cfg.poolIdle+s.cfg.settle)
	if err != nil {
		return err
	}
	if err := w.alive(); err != nil {
		return err
	}
	w.stop()
	slope := w.rssSlope(waveEnds)
	rest := restSlope(rests)
	restAnon := restAnonSlope(rests)
	if end.total() > base.total() {
		w.explain()
	}
	if err := s.verifyPath(waves); err != nil {
		return err
	}
	s.errors.report()
	logf("load average now: %s", loadAvg())
	emit("soak_errors", float64(s.errors.total()), "count")
	emit("soak_rss_slope_kb_per_min", rest, "KiB/min")
	emit("soak_rss_anon_slope_kb_per_min", restAnon, "KiB/min")
	emit("soak_rss_all_samples_slope_kb_per_min", slope, "KiB/min")
	emit("soak_goroutines_baseline", float64(base.total()), "count")
	emit("soak_goroutines_end", float64(end.total()), "count")
	growth := end.liveKB[0] - base.liveKB[0]
	if g := end.liveKB[1] - base.liveKB[1]; g > growth {
		growth = g
	}
	emit("soak_live_heap_growth_kb", float64(growth), "KiB")
	emit("soak_waves", float64(waves), "count")
	emit("soak_peak_tunnels", float64(peak), "count")
	series, err := w.istioSeries()
	if err != nil {
		return err
	}
	if s.cfg.churn == 0 {
		emit("metrics_series_end", float64(series), "count")
		return nil
	}
	emit("metrics_series_after_waves", float64(series), "count")
	logf("churn: %d short-lived pods, %d at a time", s.cfg.churn, s.cfg.churnPar)
	before := s.errors.total()
	cr, err := s.churn()
	if err != nil {
		return err
	}
	s.errors.report()
	emit("churn_pods", float64(cr.pods), "count")
	emit("churn_errors", float64(s.errors.total()-before), "count")
	emit("churn_seconds", cr.took.Seconds(), "s")
	emit("churn_pod_ms", cr.perPodMS, "ms")
	emit("metrics_series_churn_peak", float64(cr.peak), "count")
	emit("metrics_series_end", float64(cr.end), "count")
	emit("metrics_series_churned_left", float64(cr.left), "count")
	return nil
}

// setup starts the mesh, the pods and the echo server, and checks one
// round trip from every client pod.
func (s *soak) setup() error {
	// Inherited by the node proxies (meshlab adds its own variables to this
	// process's environment).
	if err := os.Setenv("POOL_UNUSED_RELEASE_TIMEOUT", s.cfg.poolIdle.String()); err != nil {
		return err
	}
	if err := setChurnEnv(s.cfg); err != nil {
		return err
	}
	if s.cfg.profile != "" {
		if err := os.Setenv("GODEBUG", benchkit.WithHeapProfile(os.Getenv("GODEBUG"))); err != nil {
			return err
		}
	}
	// Info while starting: meshlab waits for the binaries' info lines.
	m, err := meshlab.Start(s.prog, meshlab.Options{BinDir: s.cfg.binDir})
	if err != nil {
		return err
	}
	s.m = m
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := m.Cluster.AddNamespace("soak", map[string]string{"istio.io/dataplane-mode": "ambient"}); err != nil {
		return err
	}
	if s.server, err = m.AddPod(ctx, 1, testcluster.PodSpec{Name: "server", Namespace: "soak"}); err != nil {
		return err
	}
	ips := []netip.Addr{s.server.IP}
	for i := range s.cfg.clients {
		p, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: fmt.Sprintf("client-%d", i), Namespace: "soak"})
		if err != nil {
			return err
		}
		s.clients = append(s.clients, p)
		ips = append(ips, p.IP)
	}
	if err := m.WaitForWorkloads(ctx, ips...); err != nil {
		return err
	}
	if err := s.startEcho(); err != nil {
		return err
	}
	s.dst = netip.AddrPortFrom(s.server.IP, echoPort)
	for i, mn := range m.Nodes {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", mn.Proxy.PID()))
		if strings.TrimSpace(string(comm)) != meshlab.BinZtunnel {
			return fmt.Errorf("node%d proxy pid %d is %q, not %s", i, mn.Proxy.PID(), strings.TrimSpace(string(comm)), meshlab.BinZtunnel)
		}
	}
	if s.cfg.logLevel != "info" {
		for i := range m.Nodes {
			if err := setLogLevel(ctx, m.Nodes[i].Node, s.cfg.logLevel); err != nil {
				return fmt.Errorf("node%d proxy: %w", i, err)
			}
		}
	}
	for _, c := range s.clients {
		want := []byte("soak smoke test from " + c.Name)
		got, err := meshlab.RoundTrip(ctx, c, s.dst, want)
		if err != nil || string(got) != string(want) {
			return fmt.Errorf("smoke round trip %s → %s: got %q, %v", c.Name, s.dst, got, err)
		}
	}
	return nil
}

// raiseNoFile lifts RLIMIT_NOFILE so this process holds the client end of
// every tunnel, and the echo server and the node proxies, which inherit
// it, hold theirs (about one descriptor per tunnel each). Root may raise
// the hard limit (CAP_SYS_RESOURCE); where it may not (a container), the
// soft limit goes up to the hard one, which must suffice.
func raiseNoFile(tunnels int) error {
	want := uint64(tunnels + 4096)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("RLIMIT_NOFILE: %w", err)
	}
	old := lim
	if lim.Max < want {
		lim.Cur, lim.Max = want, want
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return fmt.Errorf("%d tunnels need RLIMIT_NOFILE %d; the hard limit is %d and raising it failed: %w", tunnels, want, old.Max, err)
		}
	} else {
		// Go raised this process's soft limit at start but gives children
		// the original one; an explicit Setrlimit passes this one on.
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return fmt.Errorf("RLIMIT_NOFILE to %d: %w", lim.Cur, err)
		}
	}
	logf("RLIMIT_NOFILE %d/%d → %d/%d (inherited by the mesh processes and the echo server)", old.Cur, old.Max, lim.Cur, lim.Max)
	return nil
}

func loadAvg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
