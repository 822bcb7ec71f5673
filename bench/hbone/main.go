// Command hbone benchmarks the hbone package on loopback and prints one
// figure per line as "name value unit" on stdout; details go to stderr.
// Every ratio is tunnel ÷ direct TCP measured in the same run.
//
//	go run ./bench/hbone
//
// The idle-memory figures run the server side and the application sink in
// child processes (this binary re-executed with -role), so each side's heap
// and goroutine stacks are measured alone.
//
// The peer figures (haproxy_*, hbone_chain_*, hbone_rr_*) compare our HBONE
// pair with an HAProxy mTLS pair on the same app → proxy A → mTLS →
// proxy B → app chain, all four proxies child processes, in alternating
// rounds (peer.go, haproxy.go); they need haproxy on PATH (make deps).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

var (
	clientID = identity.MustNew("cluster.local", "bench", "client")
	serverID = identity.MustNew("cluster.local", "bench", "server")
)

const (
	idleTunnels = 5000
	writeSize   = 64 << 10
)

func main() {
	role := flag.String("role", "", "internal: run as a child process (server or sink)")
	caDir := flag.String("ca-dir", "", "internal: directory with the CA root for children")
	sinkAddr := flag.String("sink", "", "internal: sink address for the server child")
	hop := flag.String("hop", "", "internal: proxy B's address for the front child")
	targets := flag.String("targets", "", "internal: comma-separated app addresses for the front child")
	only := flag.String("only", "", "run one figure only: throughput, parallel, rtt, idle, streams, handshakes, peer")
	flag.IntVar(&peerOpts.rounds, "rounds", 5, "peer comparison: alternating rounds (each measures direct, hbone and haproxy)")
	flag.DurationVar(&peerOpts.rrTime, "rr-time", 3*time.Second, "peer comparison: request/response loop time per path per round")
	flag.IntVar(&peerOpts.threads, "proxy-threads", 0, "peer comparison: GOMAXPROCS of our proxies and nbthread of HAProxy's (0: their defaults, one per CPU)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Parse()
	onlyFigure = *only
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	var err error
	switch *role {
	case "":
		if peerOpts.rounds < 1 {
			err = fmt.Errorf("-rounds %d: want at least 1", peerOpts.rounds)
			break
		}
		reaper.OnSignal("bench/hbone")
		err = run()
	case "server":
		err = childServer(*caDir, *sinkAddr)
	case "sink":
		err = childSink()
	case "front":
		err = childFront(*caDir, *hop, *targets)
	default:
		err = fmt.Errorf("unknown role %q", *role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/hbone:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

func emit(name string, value float64, unit string) {
	prec := 2
	if value >= 100 {
		prec = 0
	}
	fmt.Printf("%s %s %s\n", name, strconv.FormatFloat(value, 'f', prec, 64), unit)
}

// env is the in-process setup: a CA, the two workload certificates, an
// HBONE server and the TCP sink/echo servers.
type env struct {
	ca    *ca.CA
	certs *identity.StaticSource
	srv   *hbone.Server
	addr  netip.AddrPort
	sink  netip.AddrPort
	echo  netip.AddrPort
	null  bool // the handler uses an in-memory upstream (stream-rate figure)
}

func newEnv() (*env, error) {
	c, err := ca.New(ca.Options{})
	if err != nil {
		return nil, err
	}
	cc, err := c.Issue(clientID, time.Hour)
	if err != nil {
		return nil, err
	}
	sc, err := c.Issue(serverID, time.Hour)
	if err != nil {
		return nil, err
	}
	e := &env{ca: c, certs: identity.NewStaticSource(cc, sc)}
	if e.sink, err = serveTCP(sinkConn); err != nil {
		return nil, err
	}
	if e.echo, err = serveTCP(echoConn); err != nil {
		return nil, err
	}
	e.srv, e.addr, err = startHBONE(e.certs, func(req *hbone.Request) (net.Conn, error) {
		if e.null {
			return &nullConn{}, nil
		}
		return net.Dial("tcp", req.Authority.String())
	})
	return e, err
}

func startHBONE(certs identity.CertSource, dial func(*hbone.Request) (net.Conn, error)) (*hbone.Server, netip.AddrPort, error) {
	srv, err := hbone.NewServer(hbone.ServerConfig{
		Identity: serverID, Certs: certs,
		Handler: hbone.HandlerFunc(func(ctx context.Context, req *hbone.Request) hbone.Reply {
			up, err := dial(req)
			if err != nil {
				return hbone.Reply{Status: 503}
			}
			return hbone.Reply{Upstream: up}
		}),
	})
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	go srv.Serve(ln)
	return srv, ln.Addr().(*net.TCPAddr).AddrPort(), nil
}

func serveTCP(serve func(net.Conn)) (netip.AddrPort, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return netip.AddrPort{}, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort(), nil
}

// sinkConn reads everything with a 64 KiB buffer (io.Discard would read
// 8 KiB at a time and slow the direct baseline), then answers with the
// byte count so the writer knows when the last byte arrived.
func sinkConn(c net.Conn) {
	defer c.Close()
	buf := make([]byte, writeSize)
	var n int64
	for {
		k, err := c.Read(buf)
		n += int64(k)
		if err != nil {
			break
		}
	}
	fmt.Fprintf(c, "%d\n", n)
}

func echoConn(c net.Conn) {
	defer c.Close()
	io.Copy(c, c)
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// nullConn is an upstream that has nothing to say and swallows writes.
type nullConn struct{ net.Conn }

func (*nullConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (*nullConn) Write(p []byte) (int, error)      { return len(p), nil }
func (*nullConn) Close() error                     { return nil }
func (*nullConn) CloseWrite() error                { return nil }
func (*nullConn) SetDeadline(time.Time) error      { return nil }
func (*nullConn) SetReadDeadline(time.Time) error  { return nil }
func (*nullConn) SetWriteDeadline(time.Time) error { return nil }

func (e *env) pool(mod func(*hbone.PoolConfig)) *hbone.Pool {
	cfg := hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: e.certs}}
	if mod != nil {
		mod(&cfg)
	}
	p, err := hbone.NewPool(cfg)
	if err != nil {
		panic(err)
	}
	return p
}

func request(next, target netip.AddrPort) *hbone.ConnectRequest {
	return &hbone.ConnectRequest{
		Key: hbone.Key{Src: clientID, Dst: []identity.Identity{serverID},
			SrcIP: netip.MustParseAddr("127.0.0.1"), NextHop: next},
		Authority: target,
	}
}

func run() error {
	e, err := newEnv()
	if err != nil {
		return err
	}
	logf("machine: %d cores (GOMAXPROCS %d), %s", runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel())

	want := func(name string) bool { return onlyFigure == "" || onlyFigure == name }
	if want("throughput") {
		tr, err := throughputRatio(e, 1)
		if err != nil {
			return err
		}
		emit("hbone_throughput_ratio", tr, "ratio")
	}
	if want("parallel") {
		pr, err := throughputRatio(e, 8)
		if err != nil {
			return err
		}
		emit("hbone_parallel_ratio", pr, "ratio")
	}
	if want("rtt") {
		rr, err := rttRatio(e)
		if err != nil {
			return err
		}
		emit("hbone_rtt_ratio", rr, "ratio")
	}
	if want("idle") {
		// Fresh child processes per figure: no state left over from another.
		ch, err := startChildren()
		if err != nil {
			return err
		}
		cl, sv, err := idleBytes(ch)
		ch.stop()
		if err != nil {
			return err
		}
		emit("hbone_idle_bytes_per_tunnel_client", cl, "bytes")
		emit("hbone_idle_bytes_per_tunnel_server", sv, "bytes")
		emit("hbone_idle_bytes_per_tunnel", max(cl, sv), "bytes")
	}
	if want("streams") {
		sps, err := streamsPerSec(e)
		if err != nil {
			return err
		}
		emit("hbone_streams_per_sec_per_core", sps, "streams/s")
	}
	if want("handshakes") {
		ch, err := startChildren()
		if err != nil {
			return err
		}
		hps, err := handshakesPerSec(ch)
		ch.stop()
		if err != nil {
			return err
		}
		emit("hbone_handshakes_per_sec_per_core", hps, "handshakes/s")
	}
	if want("peer") {
		if err := runPeer(e, peerOpts); err != nil {
			return err
		}
	}
	return nil
}

// onlyFigure limits the run to one figure (for profiling); "" runs all.
var onlyFigure string

// peerOpts are the peer comparison's flags.
var peerOpts peerOptions

// ---- throughput ----

// blast writes to w for d, half-closes, and waits for the sink's count.
func blast(w net.Conn, d time.Duration) (int64, time.Duration, error) {
	buf := make([]byte, writeSize)
	start := time.Now()
	var sent int64
	for time.Since(start) < d {
		n, err := w.Write(buf)
		sent += int64(n)
		if err != nil {
			return 0, 0, err
		}
	}
	if err := w.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		return 0, 0, err
	}
	line, err := bufio.NewReader(w).ReadString('\n')
	if err != nil {
		return 0, 0, fmt.Errorf("waiting for the sink: %w", err)
	}
	got, _ := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if got != sent {
		return 0, 0, fmt.Errorf("sink got %d bytes, sent %d", got, sent)
	}
	return sent, time.Since(start), nil
}

// rate runs streams parallel blasts over conns from open and returns the
// aggregate bytes per second.
func rate(streams int, d time.Duration, open func() (net.Conn, error)) (float64, error) {
	conns := make([]net.Conn, streams)
	for i := range conns {
		c, err := open()
		if err != nil {
			return 0, err
		}
		conns[i] = c
	}
	var wg sync.WaitGroup
	var total atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			n, _, err := blast(c, d)
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
			total.Add(n)
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(total.Load()) / time.Since(start).Seconds(), nil
}

// throughputRatio alternates direct and tunnelled rounds and divides the
// best tunnelled rate by the best direct one: on a shared machine the best
// round is the one least disturbed by other load.
func throughputRatio(e *env, streams int) (float64, error) {
	p := e.pool(nil)
	defer p.Close()
	const rounds = 8
	d := 300 * time.Millisecond
	var bestDirect, bestTunnel float64
	for r := range rounds {
		direct, err := rate(streams, d, func() (net.Conn, error) { return net.Dial("tcp", e.sink.String()) })
		if err != nil {
			return 0, err
		}
		tunnel, err := rate(streams, d, func() (net.Conn, error) {
			return p.Connect(context.Background(), request(e.addr, e.sink))
		})
		if err != nil {
			return 0, err
		}
		logf("throughput %d stream(s) round %d: direct %.0f MB/s, hbone %.0f MB/s", streams, r, direct/1e6, tunnel/1e6)
		bestDirect, bestTunnel = max(bestDirect, direct), max(bestTunnel, tunnel)
	}
	return bestTunnel / bestDirect, nil
}

// ---- latency ----

func pingPong(c net.Conn, n int) (time.Duration, error) {
	b := []byte{1}
	start := time.Now()
	for range n {
		if _, err := c.Write(b); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return 0, err
		}
	}
	return time.Since(start) / time.Duration(n), nil
}

func rttRatio(e *env) (float64, error) {
	p := e.pool(nil)
	defer p.Close()
	direct, err := net.Dial("tcp", e.echo.String())
	if err != nil {
		return 0, err
	}
	defer direct.Close()
	tun, err := p.Connect(context.Background(), request(e.addr, e.echo))
	if err != nil {
		return 0, err
	}
	defer tun.Close()
	// Many short alternating batches; each path's best batch is the one
	// least disturbed by other load on the machine.
	const batches, n = 40, 250
	pingPong(direct, 500) // warm up
	pingPong(tun, 500)
	var bestDirect, bestTunnel time.Duration
	for range batches {
		d, err := pingPong(direct, n)
		if err != nil {
			return 0, err
		}
		h, err := pingPong(tun, n)
		if err != nil {
			return 0, err
		}
		if bestDirect == 0 || d < bestDirect {
			bestDirect = d
		}
		if bestTunnel == 0 || h < bestTunnel {
			bestTunnel = h
		}
	}
	logf("rtt: direct %v, hbone %v (best of %d batches of %d)", bestDirect, bestTunnel, batches, n)
	return float64(bestTunnel) / float64(bestDirect), nil
}

// ---- rates per core ----

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// perCore runs op from workers goroutines for d and returns completed
// operations per CPU-second of this process (client and server together).
func perCore(workers int, d time.Duration, op func() error) (float64, float64, error) {
	var n atomic.Int64
	var firstErr atomic.Value
	stop := time.Now().Add(d)
	cpu0, t0 := cpuTime(), time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if err := op(); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, 0, err
	}
	cpu, wall := cpuTime()-cpu0, time.Since(t0)
	return float64(n.Load()) / cpu.Seconds(), float64(n.Load()) / wall.Seconds(), nil
}

func streamsPerSec(e *env) (float64, error) {
	e.null = true
	defer func() { e.null = false }()
	p := e.pool(nil)
	defer p.Close()
	req := request(e.addr, netip.MustParseAddrPort("127.0.0.1:1"))
	one := make([]byte, 1)
	op := func() error {
		t, err := p.Connect(context.Background(), req)
		if err != nil {
			return err
		}
		t.CloseWrite()
		if _, err := t.Read(one); err != io.EOF {
			return fmt.Errorf("want EOF, got %v", err)
		}
		return t.Close()
	}
	if err := op(); err != nil { // warm the pool
		return 0, err
	}
	perCPU, perWall, err := perCore(16, 2*time.Second, op)
	logf("streams: %.0f/s wall, %.0f per CPU-second (connect, 200, half-close both ways; in-memory upstream)", perWall, perCPU)
	return perCPU, err
}

// handshakesPerSec dials and closes HBONE connections to the child
// server and divides the count by the CPU time of the busier side (this
// process is the client, the child the server): the rate one core can
// sustain for either end of new mTLS connections.
func handshakesPerSec(ch *children) (float64, error) {
	key := request(ch.hop, ch.target).Key
	op := func() error {
		cc, err := ch.pool.Dial(context.Background(), key)
		if err != nil {
			return err
		}
		return cc.Close()
	}
	if err := op(); err != nil { // warm up
		return 0, err
	}
	serverCPU := func() (time.Duration, error) {
		s, err := ch.srv.Ask("cpu")
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseInt(s, 10, 64)
		return time.Duration(n), err
	}
	s0, err := serverCPU()
	if err != nil {
		return 0, err
	}
	var n atomic.Int64
	stop := time.Now().Add(2 * time.Second)
	c0, t0 := cpuTime(), time.Now()
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if err := op(); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	time.Sleep(50 * time.Millisecond) // let the server finish its last closes
	s1, err := serverCPU()
	if err != nil {
		return 0, err
	}
	clientCPU, srvCPU, wall := cpuTime()-c0, s1-s0, time.Since(t0)
	hs := float64(n.Load())
	logf("handshakes: %.0f/s wall; per CPU-second: client %.0f, server %.0f, both ends together %.0f",
		hs/wall.Seconds(), hs/clientCPU.Seconds(), hs/srvCPU.Seconds(), hs/(clientCPU+srvCPU).Seconds())
	return hs / max(clientCPU, srvCPU).Seconds(), nil
}

// ---- idle memory ----

// memStats returns heap in use plus goroutine stacks, after GCs that also
// empty sync.Pools.
func memStats() (heap, stack uint64, goroutines int) {
	for range 3 {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc, m.StackInuse, runtime.NumGoroutine()
}
