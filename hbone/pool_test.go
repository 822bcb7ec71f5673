package hbone

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// handshakeCounter counts OnHandshake calls.
func handshakeCounter(n *atomic.Int64) func(*PoolConfig) {
	return func(c *PoolConfig) { c.OnHandshake = func(Key) { n.Add(1) } }
}

func TestPoolReusesConnection(t *testing.T) {
	m, up, srv := echoSetup(t)
	var hs atomic.Int64
	p := newPool(t, m, handshakeCounter(&hs))
	for i := range 20 {
		tun := mustConnect(t, p, connectReq(srv, up.addr))
		roundTrip(t, tun, "ping")
		if i%2 == 0 { // both clean and aborted closes must free the slot
			tun.CloseWrite()
		}
		tun.Close()
	}
	if got := hs.Load(); got != 1 {
		t.Errorf("handshakes = %d, want 1 (sequential streams share a connection)", got)
	}
	if got := p.NumConns(); got != 1 {
		t.Errorf("NumConns = %d, want 1", got)
	}
}

func TestPoolKeySeparation(t *testing.T) {
	m := newMesh(t)
	other := identity.MustNew("cluster.local", "client-ns", "other-sa")
	oc, err := m.ca.Issue(other, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	m.certs.Set(oc)
	up := startUpstream(t, echo)
	srv := startServer(t, m, dialHandler())
	var hs atomic.Int64
	p := newPool(t, m, handshakeCounter(&hs))
	r1 := connectReq(srv, up.addr)
	r2 := connectReq(srv, up.addr)
	r2.Src = other
	r3 := connectReq(srv, up.addr)
	r3.Dst = []identity.Identity{serverID, other}
	for _, r := range []*ConnectRequest{r1, r2, r3, r1, r2, r3} {
		tun := mustConnect(t, p, r)
		roundTrip(t, tun, "k")
		tun.Close()
	}
	if got := hs.Load(); got != 3 {
		t.Errorf("handshakes = %d, want 3 (one per key)", got)
	}
}

// TestPoolSpreadsLoad holds many streams open at once: they spread over
// SpreadConns connections, and past MaxStreamsPerConn more are opened.
func TestPoolSpreadsLoad(t *testing.T) {
	m, up, srv := echoSetup(t)
	var hs atomic.Int64
	p := newPool(t, m, handshakeCounter(&hs), func(c *PoolConfig) {
		c.SpreadStreams, c.SpreadConns, c.MaxStreamsPerConn = 2, 3, 10
	})
	var tuns []*Tunnel
	for range 40 {
		tun := mustConnect(t, p, connectReq(srv, up.addr))
		tuns = append(tuns, tun)
	}
	for _, tun := range tuns {
		roundTrip(t, tun, "spread")
	}
	// 40 streams at ≤10 per connection need at least 4 connections; the
	// background spreading dials add at most SpreadConns.
	n := p.NumConns()
	if n < 4 || n > 4+3 {
		t.Errorf("NumConns = %d with 40 streams (10 per conn), want 4..7", n)
	}
	load := map[*conn]int{}
	for _, tun := range tuns {
		load[tun.c]++
	}
	for c, l := range load {
		if l > 10 {
			t.Errorf("connection %p carries %d streams, limit 10", c, l)
		}
	}
	for _, tun := range tuns {
		tun.Close()
	}
}

// TestPoolOneHandshakeInFlight starts many Connects at once on a cold pool
// whose dialer is slow: only one dial runs at a time and the waiters share
// its connection.
func TestPoolOneHandshakeInFlight(t *testing.T) {
	m, up, srv := echoSetup(t)
	var hs, inFlight, maxInFlight atomic.Int64
	release := make(chan struct{})
	p := newPool(t, m, handshakeCounter(&hs), func(c *PoolConfig) {
		c.SpreadConns = -1 // no spreading: the only dial is the first one
		c.Dial = func(ctx context.Context, src netip.Addr, hop netip.AddrPort) (net.Conn, error) {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for {
				old := maxInFlight.Load()
				if n <= old || maxInFlight.CompareAndSwap(old, n) {
					break
				}
			}
			<-release
			return DefaultDial(ctx, src, hop)
		}
	})
	ctx := testCtx(t)
	const callers = 50
	var wg sync.WaitGroup
	tuns := make(chan *Tunnel, callers)
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tun, err := p.Connect(ctx, connectReq(srv, up.addr))
			if err != nil {
				errs <- err
				return
			}
			tuns <- tun
		}()
	}
	// Let the callers pile up on the one dial, then let it finish.
	waitFor(t, "the first dial to start", func() bool { return inFlight.Load() == 1 })
	close(release)
	wg.Wait()
	close(errs)
	close(tuns)
	for err := range errs {
		t.Error(err)
	}
	for tun := range tuns {
		tun.Close()
	}
	if got := maxInFlight.Load(); got != 1 {
		t.Errorf("max dials in flight = %d, want 1", got)
	}
	if got := hs.Load(); got != 1 {
		t.Errorf("handshakes = %d, want 1 for %d streams", got, callers)
	}
}

// TestPoolDialErrorShared: every waiter gets the one dial's error, with the
// NetworkPolicy hint on timeouts.
func TestPoolConnectTimeout(t *testing.T) {
	m := newMesh(t)
	p := newPool(t, m, func(c *PoolConfig) {
		c.ConnectTimeout = 50 * time.Millisecond
		c.Dial = func(ctx context.Context, _ netip.Addr, _ netip.AddrPort) (net.Conn, error) {
			<-ctx.Done() // a black-holed SYN
			return nil, ctx.Err()
		}
	})
	req := &ConnectRequest{Key: Key{Src: clientID, Dst: []identity.Identity{serverID},
		NextHop: netip.MustParseAddrPort("192.0.2.1:15008")}, Authority: netip.MustParseAddrPort("10.0.0.1:80")}
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.Connect(context.Background(), req)
			if !errors.Is(err, ErrConnectTimeout) || !strings.Contains(err.Error(), "NetworkPolicy") ||
				!strings.Contains(err.Error(), "15008") {
				t.Errorf("err = %v, want ErrConnectTimeout with the NetworkPolicy hint", err)
			} else {
				checkErrText(t, err)
			}
		}()
	}
	wg.Wait()
}

func TestPoolIdleExpiry(t *testing.T) {
	m, up, srv := echoSetup(t)
	var hs atomic.Int64
	p := newPool(t, m, handshakeCounter(&hs), func(c *PoolConfig) { c.IdleTimeout = 30 * time.Millisecond })
	tun := mustConnect(t, p, connectReq(srv, up.addr))
	roundTrip(t, tun, "a")
	// A connection with an open stream never expires, however idle.
	time.Sleep(100 * time.Millisecond)
	if p.NumConns() != 1 {
		t.Fatal("connection with an open stream expired")
	}
	roundTrip(t, tun, "b")
	tun.Close()
	waitFor(t, "the idle connection to close", func() bool { return p.NumConns() == 0 })
	tun = mustConnect(t, p, connectReq(srv, up.addr))
	roundTrip(t, tun, "c")
	tun.Close()
	if got := hs.Load(); got != 2 {
		t.Errorf("handshakes = %d, want 2 (expiry forces a new connection)", got)
	}
}

func TestIdentityMismatch(t *testing.T) {
	m, up, srv := echoSetup(t)
	p := newPool(t, m)
	req := connectReq(srv, up.addr)
	req.Dst = []identity.Identity{identity.MustNew("cluster.local", "server-ns", "impostor")}
	_, err := p.Connect(testCtx(t), req)
	if !errors.Is(err, ErrIdentityMismatch) || !errors.Is(err, ErrHandshake) {
		t.Fatalf("err = %v, want ErrHandshake and ErrIdentityMismatch", err)
	}
	checkErrText(t, err)
	// Any identity of the list is accepted.
	req.Dst = append(req.Dst, serverID)
	tun := mustConnect(t, p, req)
	tun.Close()
}

func TestStatusErrors(t *testing.T) {
	for _, code := range []int{400, 401, 503} {
		t.Run(http2StatusName(code), func(t *testing.T) {
			m := newMesh(t)
			done := make(chan error, 1)
			srv := startServer(t, m, HandlerFunc(func(ctx context.Context, req *Request) Reply {
				return Reply{Status: code, Done: func(_ TunnelStats, err error) { done <- err }}
			}))
			p := newPool(t, m)
			_, err := p.Connect(testCtx(t), connectReq(srv, netip.MustParseAddrPort("127.0.0.1:9")))
			var se *StatusError
			if !errors.As(err, &se) || se.Code != code {
				t.Fatalf("err = %v, want *StatusError{%d}", err, code)
			}
			checkErrText(t, err)
			var se2 *StatusError
			if err := <-done; !errors.As(err, &se2) || se2.Code != code {
				t.Errorf("Done got %v, want *StatusError{%d}", err, code)
			}
			// The refused stream frees its slot: the connection goes on.
			_, err = p.Connect(testCtx(t), connectReq(srv, netip.MustParseAddrPort("127.0.0.1:9")))
			if !errors.As(err, &se) {
				t.Fatalf("second Connect: %v", err)
			}
			if p.NumConns() != 1 {
				t.Errorf("NumConns = %d, want 1", p.NumConns())
			}
		})
	}
}

func http2StatusName(code int) string {
	return (&StatusError{Code: code}).Error()[len("hbone: server answered "):]
}

// TestGracefulShutdown: GOAWAY stops new streams but lets the open one
// finish; Shutdown returns once it has.
func TestGracefulShutdown(t *testing.T) {
	m, up, srv := echoSetup(t)
	p := newPool(t, m)
	ctx := testCtx(t)
	tun := mustConnect(t, p, connectReq(srv, up.addr))
	roundTrip(t, tun, "before")
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(ctx) }()
	// The GOAWAY reaches the client: the pool stops using the connection.
	waitFor(t, "GOAWAY to reach the pool", func() bool {
		_, usable := tun.c.load()
		return !usable
	})
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a stream open", err)
	default:
	}
	roundTrip(t, tun, "during drain")
	if _, err := p.Connect(ctx, connectReq(srv, up.addr)); err == nil {
		t.Error("Connect after Shutdown succeeded")
	}
	tun.CloseWrite()
	if _, err := tun.Read(make([]byte, 1)); err == nil {
		t.Error("expected EOF after half-close")
	}
	tun.Close()
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown = %v", err)
	}
}

// TestShutdownDeadline: an expired Shutdown closes what is left and
// cancels handlers.
func TestShutdownDeadline(t *testing.T) {
	m, up, srv := echoSetup(t)
	p := newPool(t, m)
	tun := mustConnect(t, p, connectReq(srv, up.addr))
	defer tun.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want DeadlineExceeded", err)
	}
	if _, err := tun.Read(make([]byte, 1)); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("read after forced close = %v, want ErrConnClosed", err)
	} else {
		checkErrText(t, err)
	}
}

// TestPoolClosedConnect: Connect after Close fails at once with
// ErrPoolClosed, and the pool dials nothing.
func TestPoolClosedConnect(t *testing.T) {
	m := newMesh(t)
	srv := startServer(t, m, dialHandler())
	var hs atomic.Int64
	p := newPool(t, m, handshakeCounter(&hs))
	p.Close()
	_, err := p.Connect(testCtx(t), connectReq(srv, srv.addr))
	if !errors.Is(err, ErrPoolClosed) {
		t.Fatalf("Connect after Close = %v, want ErrPoolClosed", err)
	}
	checkErrText(t, err)
	if got := hs.Load(); got != 0 {
		t.Errorf("handshakes = %d, want 0", got)
	}
}
