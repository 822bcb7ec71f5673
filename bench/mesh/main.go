// Command mesh benchmarks the whole mesh against direct traffic on a
// two-node cluster of network namespaces (internal/meshlab: the real
// ztunnel-cp, ztunnel-cni and ztunnel binaries) and prints one figure per
// line as "name value unit" on stdout; raw figures and progress go to
// stderr. Every ratio and difference compares two paths measured in the
// same run, alternated where the figure allows it.
//
//	go run ./bench/mesh [-bin-dir bin] [-fortio .tools/bin/fortio] [-profile DIR] [-peer=false]
//
// The topology (node0 holds the clients, node1 the servers):
//
//	mesh pair:   bench-mesh/client (captured) → bench-mesh/server (captured),
//	             HBONE through both node proxies
//	direct pair: bench-plain/client → bench-plain/server, both uncaptured
//	             (wired outside the mesh), no proxy on the path
//	outside:     10.31.1.254, a second address of bench-plain/server that the
//	             control plane never heard of: a captured client reaches it
//	             through its node proxy's passthrough (plain TCP, splice)
//	peer:        bench-plain/client → HAProxy on node0 (explicit, no capture)
//	             → mTLS → HAProxy on node1 → bench-plain/server (peer.go);
//	             its figures carry a peer_ prefix (-peer=false skips it)
//
// plus 1,000 scale pods and 10 Services (objects only, no namespaces) in
// the control plane's config, so each proxy's state holds >1,000 workloads.
//
// It needs root, iperf3 and haproxy (`make deps`), the CNI tools (`make tools`) and
// fortio (built from its Go module at FortioVersion into .tools/bin when
// missing). It is not a test: it asserts nothing beyond the setup working.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

func main() {
	binDir := flag.String("bin-dir", "", "directory with prebuilt ztunnel, ztunnel-cni, ztunnel-cp (empty: go build them)")
	fortioBin := flag.String("fortio", "", "fortio binary (empty: <repo>/.tools/bin/fortio, installed at -fortio-version when missing or another version)")
	fortioVersion := flag.String("fortio-version", FortioVersion, "fortio module version to install")
	profileDir := flag.String("profile", "", "write CPU profiles of both node proxies (iperf3 single stream, fortio) into this directory")
	iperfSecs := flag.Int("iperf-seconds", 3, "measured seconds per iperf3 run (after 1 s omitted)")
	rounds := flag.Int("rounds", 2, "alternated iperf3 rounds per path (the best counts)")
	latencyRounds := flag.Int("latency-rounds", 2, "alternated fortio rounds per path (added latency: the mean over rounds of each round's difference)")
	withPeer := flag.Bool("peer", true, "measure the HAProxy peer on the same topology, alternated with our path")
	only := flag.String("only", "", "comma-separated parts to run (iperf, latency, connect); empty means all (a partial run prints only its figures; \"none\": setup and memory only)")
	memDir := flag.String("mem-dir", "", "write what makes up each node proxy's VmRSS into this directory when mesh_proxy_rss_mb is read: /proc status, smaps_rollup, smaps, resident pages of the executable, heap profile after a collection")
	var proxyEnv stringList
	flag.Var(&proxyEnv, "proxy-env", "extra KEY=value for both node proxies (repeatable), e.g. GODEBUG=inittrace=1")
	flag.Parse()

	prog := testkit.NewProgram("bench-mesh", os.Stderr)
	// One teardown, whoever asks first; the other caller waits for it (an
	// interrupt also makes the running measurement fail, and main must not
	// exit while the signal's teardown still deletes namespaces).
	teardown := sync.OnceFunc(prog.Close)
	var interrupted atomic.Bool
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigc
		interrupted.Store(true)
		logf("interrupted: tearing down")
		teardown()
		os.Exit(130)
	}()

	if *memDir != "" || *profileDir != "" {
		// Heap profiles are asked for: the node proxies sample again.
		proxyEnv = withHeapProfile(proxyEnv)
	}
	start := time.Now()
	b := &bench{prog: prog, iperfSecs: *iperfSecs, rounds: *rounds, latencyRounds: *latencyRounds, withPeer: *withPeer,
		profileDir: *profileDir, only: *only, memDir: *memDir, proxyEnv: proxyEnv}
	err := b.run(*binDir, *fortioBin, *fortioVersion)
	teardown()
	logf("total %v (teardown included)", time.Since(start).Round(100*time.Millisecond))
	if interrupted.Load() {
		os.Exit(130)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/mesh:", err)
		os.Exit(1)
	}
	if prog.Failed() {
		os.Exit(1)
	}
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

func emit(name string, value float64, unit string) {
	prec := 2
	switch {
	case unit == "ratio" || unit == "vcpu":
		prec = 3
	case value >= 100 || value <= -100:
		prec = 0
	}
	fmt.Printf("%s %s %s\n", name, strconv.FormatFloat(value, 'f', prec, 64), unit)
}

// bench holds the running topology.
type bench struct {
	prog          *testkit.Program
	iperfSecs     int
	rounds        int
	latencyRounds int
	withPeer      bool
	profileDir    string
	only          string
	memDir        string
	proxyEnv      []string

	m      *meshlab.Mesh
	fortio string
	// The two pairs; see the package comment.
	meshClient, meshServer     *testcluster.Pod
	directClient, directServer *testcluster.Pod
	// peer is the HAProxy pair; nil with -peer=false.
	peer *peer
}

// Ports of the servers in both server pods.
const (
	iperfPort   = 5201
	fortioPort  = 8080
	greeterPort = 7000
)

// outsideIP is the second address of the direct server pod, unknown to the
// control plane (pod addresses stop at 10.31.<node>.249).
const outsideIP = "10.31.1.254"

func (b *bench) run(binDir, fortioBin, fortioVersion string) error {
	logf("machine: nproc=%d, cpu=%q, loadavg=%s", runtime.NumCPU(), cpuModel(), loadAvg())
	var err error
	if b.fortio, err = ensureFortio(fortioBin, fortioVersion); err != nil {
		return err
	}
	t0 := time.Now()
	if err := b.setup(binDir); err != nil {
		return err
	}
	logf("setup %v", time.Since(t0).Round(100*time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	var figures []func()
	if b.want("iperf") {
		// Throughput: single stream, 8 streams, passthrough (no peer).
		streams := map[path]target{
			pathDirect: {b.directClient, b.directServer.IP.String()},
			pathMesh:   {b.meshClient, b.meshServer.IP.String()},
		}
		if b.peer != nil {
			streams[pathPeer] = target{b.directClient, b.peer.addr.String()}
		}
		single, err := b.iperfPair(ctx, "single stream", 1, streams, "iperf-single")
		if err != nil {
			return err
		}
		parallel, err := b.iperfPair(ctx, "8 streams", 8, streams, "")
		if err != nil {
			return err
		}
		pass, err := b.iperfPair(ctx, "passthrough", 1, map[path]target{
			pathDirect: {b.directClient, outsideIP}, pathMesh: {b.meshClient, outsideIP}}, "")
		if err != nil {
			return err
		}
		figures = append(figures, func() {
			emit("mesh_throughput_ratio", single.ratio(pathMesh), "ratio")
			b.emitPeer("peer_throughput_ratio", func() float64 { return single.ratio(pathPeer) }, "ratio")
			emit("mesh_parallel_ratio", parallel.ratio(pathMesh), "ratio")
			b.emitPeer("peer_parallel_ratio", func() float64 { return parallel.ratio(pathPeer) }, "ratio")
			emit("mesh_passthrough_ratio", pass.ratio(pathMesh), "ratio")
		})
	}
	if b.want("latency") {
		// Latency and proxy CPU at 1000 requests/s.
		lat, err := b.latency(ctx)
		if err != nil {
			return err
		}
		figures = append(figures, func() {
			for _, pc := range []float64{50, 90, 99} {
				name := fmt.Sprintf("added_latency_p%.0f_us", pc)
				emit("mesh_"+name, lat.added(pathMesh, pc), "us")
				b.emitPeer("peer_"+name, func() float64 { return lat.added(pathPeer, pc) }, "us")
			}
			emit("mesh_proxy_cpu_per_1k_rps", lat.cpuPer1kPerProxy(pathMesh), "vcpu")
			b.emitPeer("peer_cpu_per_1k_rps", func() float64 { return lat.cpuPer1kPerProxy(pathPeer) }, "vcpu")
		})
	}
	if b.want("connect") {
		// Connection setup: to a destination outside the mesh (passthrough),
		// to a mesh server (HBONE) and through the peer.
		conn, err := b.connects(ctx)
		if err != nil {
			return err
		}
		figures = append(figures, func() {
			emit("mesh_connect_added_us", conn.added(connPassthrough), "us")
			emit("mesh_hbone_connect_added_us", conn.added(connHBONE), "us")
			b.emitPeer("peer_connect_added_us", func() float64 { return conn.added(connPeer) }, "us")
		})
	}
	// Memory after all the traffic, 1,000+ workloads in state.
	rss, err := b.proxyMemory()
	if err != nil {
		return err
	}
	figures = append(figures, func() { emit("mesh_proxy_rss_mb", rss, "MB") })
	// The same a little later, past the proxies' periodic memory release
	// (stderr only: the figure is the read right after the traffic).
	b.settledMemory(settleWait)
	if b.peer != nil {
		peerRSS, err := b.peerMemory()
		if err != nil {
			return err
		}
		figures = append(figures, func() { emit("peer_rss_mb", peerRSS, "MB") })
	}
	if err := b.verifyPaths(); err != nil {
		return err
	}
	logf("load average now: %s", loadAvg())
	for _, f := range figures {
		f()
	}
	return nil
}

// emitPeer emits the peer's figure when the peer ran.
func (b *bench) emitPeer(name string, value func() float64, unit string) {
	if b.peer != nil {
		emit(name, value(), unit)
	}
}

// want reports whether part runs (-only).
func (b *bench) want(part string) bool {
	return b.only == "" || slices.Contains(strings.Split(b.only, ","), part)
}

// setup starts the mesh, the namespaces, the scale objects, the four pods
// and the servers in the server pods.
func (b *bench) setup(binDir string) error {
	m, err := meshlab.Start(b.prog, meshlab.Options{BinDir: binDir, ProxyEnv: b.proxyEnv})
	if err != nil {
		return err
	}
	b.m = m
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ambient := map[string]string{"istio.io/dataplane-mode": "ambient"}
	for ns, labels := range map[string]map[string]string{"bench-mesh": ambient, "bench-plain": nil, scaleNamespace: ambient} {
		if err := m.Cluster.AddNamespace(ns, labels); err != nil {
			return err
		}
	}
	scaleFirst, scaleLast, err := b.applyScale()
	if err != nil {
		return err
	}
	for _, p := range []struct {
		dst  **testcluster.Pod
		node int
		spec testcluster.PodSpec
	}{
		{&b.meshClient, 0, testcluster.PodSpec{Name: "client", Namespace: "bench-mesh"}},
		{&b.meshServer, 1, testcluster.PodSpec{Name: "server", Namespace: "bench-mesh"}},
		{&b.directClient, 0, testcluster.PodSpec{Name: "client", Namespace: "bench-plain", Uncaptured: true}},
		{&b.directServer, 1, testcluster.PodSpec{Name: "server", Namespace: "bench-plain", Uncaptured: true}},
	} {
		pod, err := m.AddPod(ctx, p.node, p.spec)
		if err != nil {
			return err
		}
		*p.dst = pod
	}
	if err := m.WaitForWorkloads(ctx, b.meshClient.IP, b.meshServer.IP, b.directClient.IP, b.directServer.IP, scaleFirst, scaleLast); err != nil {
		return err
	}
	if _, err := b.directServer.Exec(ctx, "ip", "addr", "add", outsideIP+"/32", "dev", "eth0"); err != nil {
		return err
	}
	for _, srv := range []*testcluster.Pod{b.meshServer, b.directServer} {
		if err := b.startServers(ctx, srv); err != nil {
			return err
		}
	}
	if b.withPeer {
		if err := b.startPeer(ctx); err != nil {
			return err
		}
	}
	for i, mn := range m.Nodes {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", mn.Proxy.PID()))
		if strings.TrimSpace(string(comm)) != meshlab.BinZtunnel {
			return fmt.Errorf("node%d proxy pid %d is %q, not %s", i, mn.Proxy.PID(), strings.TrimSpace(string(comm)), meshlab.BinZtunnel)
		}
	}
	return nil
}

// startServers runs iperf3, fortio's echo server and the greeter in pod p.
func (b *bench) startServers(ctx context.Context, p *testcluster.Pod) error {
	tag := p.Namespace + "-" + p.Name
	ip, err := p.Start(testcluster.Process{Name: "iperf3-" + tag, Path: "iperf3",
		Args: []string{"-s", "-p", strconv.Itoa(iperfPort), "--forceflush"}})
	if err != nil {
		return err
	}
	// iperf3 exits 1 on SIGTERM: stop it here, before the cluster's
	// teardown would report that.
	b.prog.Cleanup(func() { _ = ip.Stop() })
	if err := waitListening(ctx, p, iperfPort); err != nil {
		return fmt.Errorf("iperf3 server in %s: %w (log: %s)", tag, err, ip.Log())
	}
	fp, err := p.Start(testcluster.Process{Name: "fortio-" + tag, Path: b.fortio, Dir: b.prog.TempDir(),
		Args: []string{"server", "-http-port", strconv.Itoa(fortioPort), "-grpc-port", "disabled", "-redirect-port", "disabled", "-loglevel", "Warning"}})
	if err != nil {
		return err
	}
	if err := waitListening(ctx, p, fortioPort); err != nil {
		return fmt.Errorf("fortio server in %s: %w (log: %s)", tag, err, fp.Log())
	}
	return serveGreeter(b.prog, p, greeterPort)
}

// ensureFortio returns the fortio binary: path if given, else
// <repo>/.tools/bin/fortio, installed from the Go module proxy at
// version when missing or different (GOFLAGS=-mod=mod: our go.mod is untouched).
func ensureFortio(path, version string) (string, error) {
	if path != "" {
		return path, nil
	}
	root, err := testkit.ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("fortio: %w; pass -fortio", err)
	}
	bin := filepath.Join(root, ".tools", "bin")
	path = filepath.Join(bin, "fortio")
	if out, err := runCmd(context.Background(), path, "version"); err == nil && strings.TrimSpace(out) == strings.TrimPrefix(version, "v") {
		return path, nil
	}
	logf("installing fortio %s into %s", version, bin)
	goBin := testkit.GoTool()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := runCmdEnv(ctx, []string{"GOBIN=" + bin, "GOFLAGS=-mod=mod"}, goBin, "install", "fortio.org/fortio@"+version); err != nil {
		return "", fmt.Errorf("installing fortio: %w: %s", err, out)
	}
	return path, nil
}

// FortioVersion is the pinned fortio module version. v1.69.0 and later
// import grol.io/grol (a scripting engine), which the module proxy reachable
// here does not serve; v1.68.2 is the newest without it.
const FortioVersion = "v1.68.2"
