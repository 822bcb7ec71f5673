package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"
	"weak"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/drain"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/proxy/conntrace"
)

// outboundHarness is serveOutbound behind a stand-in for 15001, carried
// through a real hbone.Pool to an in-process HBONE server that splices
// each tunnel with a TCP socket connected to itself, so the tunnel echoes
// with no goroutine at either end while idle (no network namespace: the
// original destination of a connection that was not redirected is its
// local address).
type outboundHarness struct {
	addr    string // the 15001 stand-in, on the server pod's address
	pool    *hbone.Pool
	metrics *Metrics
	served  sync.WaitGroup // one per accepted connection, done when serveOutbound calls its done
	// traceparents are the CONNECTs' traceparent headers (the first 16).
	traceparents chan string

	mu       sync.Mutex
	accepted []weak.Pointer[net.TCPConn] // only when keepWeak
	keepWeak bool
}

// idle is the pool's IdleTimeout (0: its default).
// tr (nil: none) gets the proxy's connection spans; the destination's
// traceparents go to h.traceparents.
func newOutboundHarness(t *testing.T, keepWeak bool, idle time.Duration, tr *conntrace.Tracer) *outboundHarness {
	t.Helper()
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	certs := identity.NewStaticSource()
	clientID := identity.MustNew("cluster.local", "apps", "sa-client")
	serverID := identity.MustNew("cluster.local", "apps", "sa-server")
	for _, id := range []identity.Identity{clientID, serverID} {
		wc, err := authority.Issue(id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		certs.Set(wc)
	}

	// The destination's node proxy: its "application" echoes.
	traceparents := make(chan string, 16)
	hsrv, err := hbone.NewServer(hbone.ServerConfig{Identity: serverID, Certs: certs,
		Handler: hbone.HandlerFunc(func(_ context.Context, req *hbone.Request) hbone.Reply {
			select {
			case traceparents <- req.Traceparent:
			default:
			}
			up, err := selfConnected()
			if err != nil {
				t.Errorf("echo socket: %v", err)
				return hbone.Reply{Status: 503}
			}
			return hbone.Reply{Upstream: up}
		})})
	if err != nil {
		t.Fatal(err)
	}
	hln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hsrv.Serve(hln)
	t.Cleanup(func() { hsrv.Close() })
	pool, err := hbone.NewPool(hbone.PoolConfig{IdleTimeout: idle, ClientConfig: hbone.ClientConfig{Certs: certs,
		Dial: func(ctx context.Context, _ netip.Addr, _ netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", hln.Addr().String())
		}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })

	store := state.NewStore()
	pt.Apply(t, store, pt.Pod("apps", "client", "127.0.0.1"), pt.Pod("apps", "server", "127.0.0.2", pt.OnNode("node1")))
	h := &outboundHarness{pool: pool, metrics: NewMetrics(prometheus.NewRegistry()), keepWeak: keepWeak,
		traceparents: traceparents}
	p := &WorkloadProxy{
		d: &Deps{Store: store, Certs: certs, Pool: pool, Metrics: h.metrics, Tracer: tr,
			Config: &config.Config{NodeName: "node0", TrustDomain: "cluster.local"}},
		info:     WorkloadInfo{Name: "client", Namespace: "apps", ServiceAccount: "sa-client"},
		id:       clientID,
		log:      zap.NewNop(),
		access:   zap.NewNop(),
		pool:     pool,
		group:    drain.New(),
		closedCh: make(chan struct{}),
	}
	p.ctx = p.group.Context()
	t.Cleanup(p.group.Close)

	// The 15001 stand-in listens on the server pod's address, so what it
	// accepts is routed there over HBONE.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2 on loopback: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	h.addr = ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if h.keepWeak {
				h.mu.Lock()
				h.accepted = append(h.accepted, weak.Make(c.(*net.TCPConn)))
				h.mu.Unlock()
			}
			done, _ := p.group.Track()
			h.served.Add(1)
			go p.serveOutbound(c, func() {
				done()
				h.served.Done()
			})
		}
	}()
	return h
}

// selfConnected returns a TCP connection to itself (bound to a loopback
// port and connected to that port: a simultaneous open with itself), whose
// reads return what was written to it and EOF after CloseWrite: an echo
// server with no goroutine. It closes with a reset (SO_LINGER 0), so that
// thousands of them leave no TIME_WAIT behind; a port refused
// (EADDRINUSE) is tried again with another.
func selfConnected() (net.Conn, error) {
	for try := 0; ; try++ {
		c, err := selfConnectedOnce()
		if errors.Is(err, syscall.EADDRINUSE) && try < 20 {
			continue
		}
		return c, err
	}
}

func selfConnectedOnce() (net.Conn, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "self-connected")
	defer f.Close() // net.FileConn has a copy
	if err := syscall.SetsockoptLinger(fd, syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1}); err != nil {
		return nil, err
	}
	// Its own loopback address, and SO_REUSEADDR: ports the other tests'
	// connections hold in TIME_WAIT on 127.0.0.1 do not run it out.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		return nil, err
	}
	lo := &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 3}}
	if err := syscall.Bind(fd, lo); err != nil {
		return nil, err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return nil, err
	}
	if err := syscall.Connect(fd, sa); err != nil {
		return nil, fmt.Errorf("connect to itself: %w", err)
	}
	return net.FileConn(f)
}

// TestOutboundReleasesClosedTunnels drives serveOutbound with many tunnels
// open at once, as bench/soak does, and checks that once they have closed
// nothing keeps their Results or accepted connections reachable, while
// the pooled HBONE connection that carried them is still open (its stream
// map must not hold them either). Weak pointers make it exact: after a GC
// each is nil or the object leaked. It does not see memory that outlives
// the objects without pointing at them (a map's buckets, a pool's
// buffers): TestOutboundNoRetention does.
func TestOutboundReleasesClosedTunnels(t *testing.T) {
	const n = 1000
	h := newOutboundHarness(t, true, 0, nil)
	m := h.metrics
	var results []weak.Pointer[Result]
	openEchoClose(t, h.addr, n, func() {
		// Every tunnel is open: its Result is in the live set.
		m.live.mu.Lock()
		for r := range m.live.conns.all() {
			if !r.MTLS || r.Dst.Workload != "server" {
				t.Errorf("connection to %s not carried over HBONE to the server pod (mTLS %v, destination %q)", r.DstAddr, r.MTLS, r.Dst.Workload)
			}
			results = append(results, weak.Make(r))
		}
		m.live.mu.Unlock()
	})
	h.served.Wait() // every connection's Result is recorded
	if len(results) != n {
		t.Fatalf("%d Results open with %d tunnels", len(results), n)
	}
	if h.pool.NumConns() == 0 {
		t.Fatal("the pooled HBONE connections closed; the check is meant to run while they live")
	}
	runtime.GC()
	runtime.GC()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.accepted) != n {
		t.Fatalf("accepted %d connections, want %d", len(h.accepted), n)
	}
	if k := liveCount(h.accepted); k != 0 {
		t.Errorf("%d of %d closed outbound connections still reachable after GC", k, n)
	}
	if k := liveCount(results); k != 0 {
		t.Errorf("%d of %d Results of closed outbound connections still reachable after GC", k, n)
	}
}

func liveCount[T any](ws []weak.Pointer[T]) int {
	k := 0
	for _, w := range ws {
		if w.Value() != nil {
			k++
		}
	}
	return k
}

// maxDialing is how many connections openEchoClose sets up at once.
const maxDialing = 128

// openEchoClose opens n connections to addr, at most 128 dials at a time
// (a burst of thousands would overflow the listener's backlog), echoes
// 1 KiB on each, runs whileOpen with all of them open, and closes them.
func openEchoClose(t *testing.T, addr string, n int, whileOpen func()) {
	t.Helper()
	msg := bytes.Repeat([]byte("0123456789abcdef"), 64)
	conns := make([]net.Conn, n)
	errc := make(chan error, n)
	dialing := make(chan struct{}, maxDialing)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		dialing <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-dialing }()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errc <- err
				return
			}
			conns[i] = c
			c.SetDeadline(time.Now().Add(30 * time.Second))
			buf := make([]byte, len(msg))
			if _, err := c.Write(msg); err != nil {
				errc <- fmt.Errorf("tunnel %d: write: %w", i, err)
				return
			}
			if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, msg) {
				errc <- fmt.Errorf("tunnel %d: echo %.16q: %v", i, buf, err)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if !t.Failed() {
		whileOpen()
	}
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// TestOutboundNoRetention opens and closes 10,000 tunnels through the
// outbound path (two waves of 5,000 open at once, as bench/soak's waves)
// and checks that the live heap (HeapAlloc after two GCs, so sync.Pool's
// victim cache is empty too) comes back to within a bound of its level
// before them, once the pooled HBONE connections have expired. It catches
// what TestOutboundReleasesClosedTunnels cannot: memory that outlives the
// tunnels without pointing at them, like a map that keeps the buckets of
// its largest burst (the proxy context's children, the live set) or
// buffers parked in something long-lived.
//
// One small wave runs before the baseline, so that what is made once
// (metric series, TLS and hpack tables' code paths, the verify cache) is
// in it. The runtime never frees a goroutine's descriptor (about 490
// bytes), so a goroutine per open tunnel would leave the wave's peak
// behind (2.4 MB for 5,000). An idle tunnel holds none at either end
// (hbone.SpliceAsync; the harness's echo is a socket connected to itself),
// so the peak is the connections being set up, at most 128 at a time
// (openEchoClose), each with three or four goroutines for a moment (the
// test's client, serveOutbound, the server's stream, a drain delivering
// the echo): the test logs the peak (519 measured on 2026-12-06), and
// reserveGoroutines creates 5 per dial before the baseline, a bound of the
// test's dialing, not of the tunnels, and 128 more for the sockets that
// linger in the runtime's poller after their bytes (hbone's maxLingering;
// the harness's echo sockets linger too).
func TestOutboundNoRetention(t *testing.T) {
	if testing.Short() {
		t.Skip("short: opens 10,000 tunnels")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory and sync.Pool's random drops make heap figures meaningless")
	}
	const (
		perWave = 5000
		waves   = 2
		// bound: 64 bytes per tunnel carried (640 KiB; the issue asks for
		// 1 MB after 10,000). Measured 2026-12-05: 108-159 KiB, mostly the
		// runtime's (stopped connect-timeout timers it removes from its
		// timer heaps lazily, deadline timers of the test's own sockets);
		// 500-523 KiB before the proxy's context and live set gave back
		// what the 5,000-tunnel waves grew. Since SpliceAsync (2026-12-06)
		// 16-371 KiB: the runtime's share moves with how many goroutines
		// and timers the waves' scheduling happened to make, so 32 bytes a
		// tunnel failed now and then with nothing kept per tunnel.
		bound = 64 * perWave * waves
	)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 2*perWave+1000 {
		t.Skipf("needs %d file descriptors (RLIMIT_NOFILE %d: %v)", 2*perWave+1000, lim.Cur, err)
	}
	if os.Getenv("ZTUNNEL_TEST_HEAP_PROFILE") != "" {
		defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
		runtime.MemProfileRate = 512 // every allocation of the proxy's size shows
	}
	h := newOutboundHarness(t, false, 100*time.Millisecond, nil)
	// +1: hbone's epoll waiter, started by the first splice for good (its
	// workers exit after two idle seconds).
	quiet := runtime.NumGoroutine() + 1
	settle := func() {
		t.Helper()
		h.served.Wait()
		// The pool's connections expire after their idle timeout, and
		// the server's end with them (one read loop each).
		deadline := time.Now().Add(time.Minute)
		for h.pool.NumConns() > 0 || runtime.NumGoroutine() > quiet {
			if time.Now().After(deadline) {
				t.Fatalf("pooled connections did not expire: %d open, %d goroutines (%d before)", h.pool.NumConns(), runtime.NumGoroutine(), quiet)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	openEchoClose(t, h.addr, 10, func() {})
	settle()
	reserveGoroutines(5*maxDialing + 2*128)
	before := liveHeap(t, "before")
	peak := 0
	for range waves {
		wavePeak := samplePeakGoroutines()
		openEchoClose(t, h.addr, perWave, func() {})
		peak = max(peak, wavePeak())
		settle()
	}
	t.Logf("at most %d goroutines during the waves (sampled every millisecond)", peak)
	after := liveHeap(t, "after")
	t.Logf("live heap %d KiB before %d tunnels, %d KiB after (%+d bytes)", before>>10, perWave*waves, after>>10, int64(after)-int64(before))
	if after > before+bound {
		t.Errorf("live heap grew by %d bytes over %d tunnels opened and closed (bound %d): something keeps memory per tunnel, or per tunnel of the largest wave; "+
			"ZTUNNEL_TEST_HEAP_PROFILE=DIR writes DIR/{before,after}.pprof for `go tool pprof -top -diff_base`",
			after-before, perWave*waves, bound)
	}
}

// liveHeap collects twice (the second empties sync.Pool's victim cache)
// and returns HeapAlloc; with ZTUNNEL_TEST_HEAP_PROFILE set it writes the
// heap profile to that directory as <name>.pprof.
func liveHeap(t *testing.T, name string) uint64 {
	t.Helper()
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if dir := os.Getenv("ZTUNNEL_TEST_HEAP_PROFILE"); dir != "" {
		f, err := os.Create(filepath.Join(dir, name+".pprof"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			t.Fatal(err)
		}
	}
	return ms.HeapAlloc
}

// TestOutboundIdleTunnelsNoGoroutine opens 2,000 tunnels through the
// outbound path and, while they are all open and idle, counts the
// process's goroutines: an idle tunnel must hold none, at the client's
// proxy (serveOutbound returned; the client→tunnel direction waits in
// hbone's epoll set) nor at the destination's (serveStream returned; the
// harness's echo is a socket connected to itself). The bound is 200: the
// test's and the runtime's own goroutines, the pooled HBONE connections'
// read loops (2,000 tunnels at 100 streams each: 20 connections, a read
// loop at each end, 40) and hbone's waiter and idle workers — a goroutine
// per tunnel would be 2,000 or more.
func TestOutboundIdleTunnelsNoGoroutine(t *testing.T) {
	const n = 2000
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 3*n+500 {
		t.Skipf("needs %d file descriptors (RLIMIT_NOFILE %d: %v)", 3*n+500, lim.Cur, err)
	}
	h := newOutboundHarness(t, false, 0, nil)
	openEchoClose(t, h.addr, n, func() {
		// Every tunnel echoed and is open; wait for the goroutines that set
		// them up to return.
		var g int
		deadline := time.Now().Add(10 * time.Second)
		for {
			g = runtime.NumGoroutine()
			if g <= 200 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		h.metrics.live.mu.Lock()
		open := h.metrics.live.conns.len()
		h.metrics.live.mu.Unlock()
		if open != n {
			t.Errorf("%d connections open in the live set, want %d", open, n)
		}
		t.Logf("%d goroutines with %d idle tunnels open", g, n)
		if g > 200 {
			var buf bytes.Buffer
			pprof.Lookup("goroutine").WriteTo(&buf, 1)
			t.Errorf("%d goroutines with %d idle tunnels open (bound 200); stacks:\n%.6000s", g, n, buf.String())
		}
	})
	h.served.Wait() // every splice has ended and recorded its Result
}

// reserveGoroutines makes the runtime hold n more goroutine descriptors
// (it reuses and never frees them) by running n goroutines at once.
func reserveGoroutines(n int) {
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() { defer wg.Done(); <-release }()
	}
	close(release)
	wg.Wait()
}

// samplePeakGoroutines samples runtime.NumGoroutine every millisecond
// until the returned function is called, which returns the highest.
func samplePeakGoroutines() func() int {
	stop := make(chan struct{})
	res := make(chan int)
	go func() {
		peak := 0
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			peak = max(peak, runtime.NumGoroutine())
			select {
			case <-stop:
				res <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return func() int {
		close(stop)
		return <-res
	}
}
