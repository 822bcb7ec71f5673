package hbone

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// asyncSplice is a client socket a whose proxy end is spliced with a
// tunnel by SpliceAsync; done receives the splice's result.
type asyncSplice struct {
	a    *net.TCPConn // the application's end
	c    *net.TCPConn // the proxy's end, owned by the splice
	tun  *Tunnel
	done chan error
}

func startAsync(t *testing.T, p *Pool, req *ConnectRequest) *asyncSplice {
	t.Helper()
	a, c := testkit.TCPPair(t)
	s := &asyncSplice{a: a, c: c, tun: mustConnect(t, p, req), done: make(chan error, 2)}
	SpliceAsync(s.tun, s.c, func(err error) { s.done <- err })
	return s
}

// result waits for the splice's result and checks done is called once.
func (s *asyncSplice) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.done:
		select {
		case err2 := <-s.done:
			t.Fatalf("done called twice: %v, then %v", err, err2)
		case <-time.After(50 * time.Millisecond):
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the splice did not end")
		return nil
	}
}

func (s *asyncSplice) notDone(t *testing.T) {
	t.Helper()
	select {
	case err := <-s.done:
		t.Fatalf("the splice ended early: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
}

// heldServer's handler hands each server-side tunnel to the test and keeps
// it until the test releases it.
func heldServer(t *testing.T, m *mesh) (*testServer, chan *Tunnel) {
	peers := make(chan *Tunnel, 4)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv := startServer(t, m, HandlerFunc(func(context.Context, *Request) Reply {
		return Reply{Serve: func(st *Tunnel) error {
			peers <- st
			<-release
			return nil
		}}
	}))
	return srv, peers
}

func readAll(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read to EOF: %v (got %q)", err, b)
	}
	return string(b)
}

// TestSpliceAsyncHalfCloseBothWays: data both ways, then each side's
// half-close passes through, and the splice ends cleanly.
func TestSpliceAsyncHalfCloseBothWays(t *testing.T) {
	m := newMesh(t)
	srv, peers := heldServer(t, m)
	s := startAsync(t, newPool(t, m), connectReq(srv, srv.addr))
	st := <-peers
	if _, err := s.a.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("server read %q, %v", buf, err)
	}
	time.Sleep(20 * time.Millisecond) // idle: the watch is armed
	s.a.CloseWrite()
	if _, err := st.Read(buf); err != io.EOF {
		t.Fatalf("server read after the client's half-close: %v, want EOF", err)
	}
	s.notDone(t) // the other direction is still open
	if _, err := st.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	st.CloseWrite()
	if got := readAll(t, s.a); got != "pong" {
		t.Fatalf("client read %q, want pong then EOF", got)
	}
	if err := s.result(t); err != nil {
		t.Fatalf("splice ended with %v, want nil", err)
	}
	if st := s.tun.Stats(); st.BytesSent != 4 || st.BytesReceived != 4 {
		t.Errorf("stats %+v, want 4 and 4", st)
	}
}

// TestSpliceAsyncPeerResetWhileIdle: the tunnel's peer resets the stream
// while no byte moves: the watch is woken, c closed, the reset reported.
func TestSpliceAsyncPeerResetWhileIdle(t *testing.T) {
	m := newMesh(t)
	srv, peers := heldServer(t, m)
	s := startAsync(t, newPool(t, m), connectReq(srv, srv.addr))
	st := <-peers
	time.Sleep(20 * time.Millisecond)
	st.Close() // nothing half-closed: RST_STREAM(CANCEL)
	var se *StreamResetError
	if err := s.result(t); !errors.As(err, &se) {
		t.Fatalf("splice ended with %v, want a stream reset", err)
	}
	if got := readAll(t, s.a); got != "" {
		t.Fatalf("client read %q", got)
	}
}

// TestSpliceAsyncCloseTunnelWhileIdle: closing the tunnel from outside
// (the proxy's force) ends an idle splice and closes c.
func TestSpliceAsyncCloseTunnelWhileIdle(t *testing.T) {
	m, up, srv := echoSetup(t)
	s := startAsync(t, newPool(t, m), connectReq(srv, up.addr))
	roundTrip(t, s.a, "hello")
	time.Sleep(20 * time.Millisecond)
	s.tun.Close()
	if err := s.result(t); err == nil {
		t.Fatal("splice ended with nil after a forced close")
	}
	s.a.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := s.a.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("client read after the force: %v, want EOF or reset", err)
	}
}

// TestSpliceAsyncClientResetWhileIdle: the application resets its
// connection (RST): the watch reads the error, the tunnel is reset.
func TestSpliceAsyncClientResetWhileIdle(t *testing.T) {
	m := newMesh(t)
	srv, peers := heldServer(t, m)
	s := startAsync(t, newPool(t, m), connectReq(srv, srv.addr))
	st := <-peers
	time.Sleep(20 * time.Millisecond)
	s.a.SetLinger(0)
	s.a.Close()
	if err := s.result(t); err == nil || !strings.Contains(err.Error(), "reset") {
		t.Fatalf("splice ended with %v, want connection reset", err)
	}
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	var se *StreamResetError
	if _, err := st.Read(make([]byte, 1)); !errors.As(err, &se) {
		t.Fatalf("server read %v, want a stream reset", err)
	}
}

// TestSpliceAsyncClientCloseWhileIdle: the application closes (FIN): the
// tunnel is half-closed, and the splice ends when the peer ends too.
func TestSpliceAsyncClientCloseWhileIdle(t *testing.T) {
	m := newMesh(t)
	srv, peers := heldServer(t, m)
	s := startAsync(t, newPool(t, m), connectReq(srv, srv.addr))
	st := <-peers
	time.Sleep(20 * time.Millisecond)
	s.a.Close()
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := st.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("server read %v, want EOF", err)
	}
	st.CloseWrite()
	// Writing to the closed client may fail (RST); either way it ends.
	s.result(t)
}

// TestSpliceAsyncBytesAtRearm writes in small bursts with and without
// pauses, so bytes arrive while the worker is between its EAGAIN and going
// idle: none may be left unread.
func TestSpliceAsyncBytesAtRearm(t *testing.T) {
	m, up, srv := echoSetup(t)
	s := startAsync(t, newPool(t, m), connectReq(srv, up.addr))
	const rounds = 2000
	total := 0
	errc := make(chan error, 1)
	go func() {
		var b [64]byte
		for i := range rounds {
			n := 1 + rand.IntN(len(b))
			for j := range n {
				b[j] = byte(i + j)
			}
			if _, err := s.a.Write(b[:n]); err != nil {
				errc <- err
				return
			}
			if i%7 == 0 {
				time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
			}
		}
		errc <- s.a.CloseWrite()
	}()
	got := readAll(t, s.a)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	total = len(got)
	if err := s.result(t); err != nil {
		t.Fatalf("splice ended with %v", err)
	}
	if sent := s.tun.Stats().BytesSent; int(sent) != total {
		t.Fatalf("echoed %d bytes, the tunnel sent %d", total, sent)
	}
}

// TestSpliceAsyncConnClosedUnderWatch: a caller that closes c itself (the
// kernel drops it from the epoll set without an event) still sees the
// splice end, through the sweep.
func TestSpliceAsyncConnClosedUnderWatch(t *testing.T) {
	m, up, srv := echoSetup(t)
	s := startAsync(t, newPool(t, m), connectReq(srv, up.addr))
	roundTrip(t, s.a, "hello")
	time.Sleep(20 * time.Millisecond)
	s.c.Close()
	// The read fails (net.ErrClosed) and resets the tunnel, whose error
	// is then the cause, as for Splice.
	if err := s.result(t); err == nil {
		t.Fatal("splice ended with nil after c was closed under it")
	}
}

// TestSpliceAsyncIdleNoGoroutine: idle spliced tunnels hold no goroutine
// at either end (the server splices its upstream with SpliceAsync too).
func TestSpliceAsyncIdleNoGoroutine(t *testing.T) {
	m := newMesh(t)
	// The upstream is the proxy-side end of a loopback pair whose other
	// end the test keeps: no goroutine there either.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var apps []net.Conn
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range apps {
			c.Close()
		}
	}()
	srv := startServer(t, m, HandlerFunc(func(context.Context, *Request) Reply {
		up, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return Reply{Status: 503}
		}
		app, err := ln.Accept()
		if err != nil {
			up.Close()
			return Reply{Status: 503}
		}
		mu.Lock()
		apps = append(apps, app)
		mu.Unlock()
		return Reply{Upstream: up}
	}))
	p := newPool(t, m)
	before := runtime.NumGoroutine()
	const n = 200
	var ss []*asyncSplice
	for range n {
		s := startAsync(t, p, connectReq(srv, srv.addr))
		ss = append(ss, s)
	}
	var g int
	deadline := time.Now().Add(5 * time.Second)
	for g = runtime.NumGoroutine(); g-before > n/4 && time.Now().Before(deadline); g = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	// A few for the pooled HBONE connections (n/100 at each end) and the
	// splice workers and waiter; one per tunnel would be n or more.
	if g-before > n/4 {
		t.Fatalf("%d goroutines more with %d idle spliced tunnels", g-before, n)
	}
	for _, s := range ss {
		s.tun.Close()
	}
	for _, s := range ss {
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			t.Fatal("a splice did not end after its tunnel closed")
		}
	}
}

// TestRequestAbort: the handler ends a tunnel it answered, as a policy
// change does: the client's splice ends, Done gets an error.
func TestRequestAbort(t *testing.T) {
	m := newMesh(t)
	up := startUpstream(t, echo)
	reqs := make(chan *Request, 1)
	dones := make(chan error, 1)
	srv := startServer(t, m, HandlerFunc(func(ctx context.Context, req *Request) Reply {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", up.addr.String())
		if err != nil {
			return Reply{Status: 503}
		}
		reqs <- req
		return Reply{Upstream: c, Done: func(_ TunnelStats, err error) { dones <- err }}
	}))
	s := startAsync(t, newPool(t, m), connectReq(srv, up.addr))
	req := <-reqs
	roundTrip(t, s.a, "hello")
	time.Sleep(20 * time.Millisecond)
	req.Abort()
	select {
	case err := <-dones:
		if err == nil {
			t.Fatal("Done got nil after Abort")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Done not called after Abort")
	}
	if err := s.result(t); err == nil {
		t.Fatal("client splice ended with nil after the server aborted")
	}
}
