package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
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
)

// TestOutboundReleasesClosedTunnels drives serveOutbound through a real
// hbone.Pool to an in-process HBONE server (no network namespace: the
// original destination of a connection that was not redirected is its
// local address), with many tunnels open at once as bench/soak does, and
// checks that once they have closed nothing keeps their Results or
// accepted connections reachable, while the pooled HBONE connection that
// carried them is still open (its stream map must not hold them either).
// Weak pointers make it exact: after a GC each is nil or the object leaked.
func TestOutboundReleasesClosedTunnels(t *testing.T) {
	const n = 1000
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
	hsrv, err := hbone.NewServer(hbone.ServerConfig{Identity: serverID, Certs: certs,
		Handler: hbone.HandlerFunc(func(context.Context, *hbone.Request) hbone.Reply {
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
	pool, err := hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: certs,
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
	m := NewMetrics(prometheus.NewRegistry())
	p := &WorkloadProxy{
		d: &Deps{Store: store, Certs: certs, Pool: pool, Metrics: m,
			Config: &config.Config{NodeName: "node0", TrustDomain: "cluster.local"}},
		info:     WorkloadInfo{Name: "client", Namespace: "apps", ServiceAccount: "sa-client"},
		id:       clientID,
		log:      zap.NewNop(),
		access:   zap.NewNop(),
		pool:     pool,
		group:    drain.New(),
		closedCh: make(chan struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	t.Cleanup(p.cancel)

	// The 15001 stand-in listens on the server pod's address, so what it
	// accepts is routed there over HBONE.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2 on loopback: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	var (
		mu       sync.Mutex
		accepted []weak.Pointer[net.TCPConn]
		served   sync.WaitGroup
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, weak.Make(c.(*net.TCPConn)))
			mu.Unlock()
			done, _ := p.group.Track()
			served.Add(1)
			go func() {
				defer served.Done()
				p.serveOutbound(c, done)
			}()
		}
	}()

	var results []weak.Pointer[Result]
	openEchoClose(t, ln.Addr().String(), n, func() {
		// Every tunnel is open: its Result is in the live set.
		m.live.mu.Lock()
		for r := range m.live.conns {
			if !r.MTLS || r.Dst.Workload != "server" {
				t.Errorf("connection to %s not carried over HBONE to the server pod (mTLS %v, destination %q)", r.DstAddr, r.MTLS, r.Dst.Workload)
			}
			results = append(results, weak.Make(r))
		}
		m.live.mu.Unlock()
	})
	served.Wait() // every serveOutbound has returned
	if len(results) != n {
		t.Fatalf("%d Results open with %d tunnels", len(results), n)
	}
	if pool.NumConns() == 0 {
		t.Fatal("the pooled HBONE connections closed; the check is meant to run while they live")
	}
	runtime.GC()
	runtime.GC()
	mu.Lock()
	defer mu.Unlock()
	if len(accepted) != n {
		t.Fatalf("accepted %d connections, want %d", len(accepted), n)
	}
	if k := liveCount(accepted); k != 0 {
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

// openEchoClose opens n connections to addr at once, echoes 1 KiB on each,
// runs whileOpen with all of them open, and closes them.
func openEchoClose(t *testing.T, addr string, n int, whileOpen func()) {
	t.Helper()
	msg := bytes.Repeat([]byte("0123456789abcdef"), 64)
	conns := make([]net.Conn, n)
	errc := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
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
