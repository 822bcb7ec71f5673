package proxy

import (
	"bytes"
	"context"
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
// through a real hbone.Pool to an in-process HBONE server that echoes
// inside the tunnel (no network namespace: the original destination of a
// connection that was not redirected is its local address).
type outboundHarness struct {
	addr    string // the 15001 stand-in, on the server pod's address
	pool    *hbone.Pool
	metrics *Metrics
	served  sync.WaitGroup // one per accepted connection, done when serveOutbound returns
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

	// The destination's node proxy: it echoes inside the tunnel.
	traceparents := make(chan string, 16)
	hsrv, err := hbone.NewServer(hbone.ServerConfig{Identity: serverID, Certs: certs,
		Handler: hbone.HandlerFunc(func(_ context.Context, req *hbone.Request) hbone.Reply {
			select {
			case traceparents <- req.Traceparent:
			default:
			}
			return hbone.Reply{Serve: func(tun *hbone.Tunnel) error {
				_, err := io.Copy(tun, tun)
				tun.CloseWrite()
				return err
			}}
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
			go func() {
				defer h.served.Done()
				p.serveOutbound(c, done)
			}()
		}
	}()
	return h
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
	h.served.Wait() // every serveOutbound has returned
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

// openEchoClose opens n connections to addr, at most 128 dials at a time
// (a burst of thousands would overflow the listener's backlog), echoes
// 1 KiB on each, runs whileOpen with all of them open, and closes them.
func openEchoClose(t *testing.T, addr string, n int, whileOpen func()) {
	t.Helper()
	msg := bytes.Repeat([]byte("0123456789abcdef"), 64)
	conns := make([]net.Conn, n)
	errc := make(chan error, n)
	dialing := make(chan struct{}, 128)
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
// Two things are set up before the baseline because they are the Go
// runtime's, not the proxy's: the runtime never frees a goroutine's
// descriptor (about 490 bytes; it keeps them for reuse), so the first wave
// would leave its peak goroutine count behind whatever the proxy does;
// reserveGoroutines creates as many first. And one small wave runs before
// the baseline, so that what is made once (metric series, TLS and hpack
// tables' code paths, the verify cache) is in it.
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
		// bound: 32 bytes per tunnel carried (320 KiB; the issue asks for
		// 1 MB after 10,000). Measured 2026-12-05: 108-159 KiB, mostly the
		// runtime's (stopped connect-timeout timers it removes from its
		// timer heaps lazily, deadline timers of the test's own sockets);
		// 500-523 KiB before the proxy's context and live set gave back
		// what the 5,000-tunnel waves grew.
		bound = 32 * perWave * waves
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
	quiet := runtime.NumGoroutine()
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
	reserveGoroutines(4 * perWave) // per tunnel: the client's, serveOutbound, the server's handler
	before := liveHeap(t, "before")
	for range waves {
		openEchoClose(t, h.addr, perWave, func() {})
		settle()
	}
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
