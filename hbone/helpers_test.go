package hbone

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

var (
	clientID = identity.MustNew("cluster.local", "client-ns", "client-sa")
	serverID = identity.MustNew("cluster.local", "server-ns", "server-sa")
)

// mesh is a test CA with a client and a server workload certificate.
type mesh struct {
	ca     *ca.CA
	certs  *identity.StaticSource
	client *identity.WorkloadCertificate
	server *identity.WorkloadCertificate
}

func newMesh(t testing.TB) *mesh {
	t.Helper()
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := &mesh{ca: c}
	if m.client, err = c.Issue(clientID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if m.server, err = c.Issue(serverID, time.Hour); err != nil {
		t.Fatal(err)
	}
	m.certs = identity.NewStaticSource(m.client, m.server)
	return m
}

// upstream is a TCP server on 127.0.0.1:0 that runs serve per connection.
type upstream struct {
	ln    net.Listener
	addr  netip.AddrPort
	conns atomic.Int64
	wg    sync.WaitGroup
}

func startUpstream(t testing.TB, serve func(c *net.TCPConn)) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{ln: ln, addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				defer c.Close()
				serve(c.(*net.TCPConn))
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return u
}

// echo copies everything back and half-closes after EOF.
func echo(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

// dialHandler answers every CONNECT by dialling its authority.
func dialHandler() Handler {
	return HandlerFunc(func(ctx context.Context, req *Request) Reply {
		var d net.Dialer
		up, err := d.DialContext(ctx, "tcp", req.Authority.String())
		if err != nil {
			return Reply{Status: 503}
		}
		return Reply{Upstream: up}
	})
}

type testServer struct {
	*Server
	addr netip.AddrPort
	logs *observer.ObservedLogs
}

func startServer(t testing.TB, m *mesh, h Handler, mod ...func(*ServerConfig)) *testServer {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	cfg := ServerConfig{Identity: serverID, Certs: m.certs, Handler: h, Logger: zap.New(core)}
	for _, f := range mod {
		f(&cfg)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		} else {
			checkErrText(t, err)
		}
	})
	return &testServer{Server: s, addr: ln.Addr().(*net.TCPAddr).AddrPort(), logs: logs}
}

func newPool(t testing.TB, m *mesh, mod ...func(*PoolConfig)) *Pool {
	t.Helper()
	cfg := PoolConfig{ClientConfig: ClientConfig{Certs: m.certs}}
	for _, f := range mod {
		f(&cfg)
	}
	p, err := NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func connectReq(srv *testServer, target netip.AddrPort) *ConnectRequest {
	return &ConnectRequest{
		Key: Key{
			Src:     clientID,
			Dst:     []identity.Identity{serverID},
			SrcIP:   netip.MustParseAddr("127.0.0.1"),
			NextHop: srv.addr,
		},
		Authority: target,
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// echoSetup is the fixture most tests start from: a mesh, an echo upstream
// and a server whose handler dials what each CONNECT asks for.
func echoSetup(t testing.TB) (*mesh, *upstream, *testServer) {
	t.Helper()
	m := newMesh(t)
	return m, startUpstream(t, echo), startServer(t, m, dialHandler())
}

// mustConnect opens a tunnel through p or fails the test; the tunnel is
// the caller's to close.
func mustConnect(t testing.TB, p *Pool, req *ConnectRequest) *Tunnel {
	t.Helper()
	tun, err := p.Connect(testCtx(t), req)
	if err != nil {
		t.Fatalf("Connect %s: %v", req.Authority, err)
	}
	return tun
}

// roundTrip writes msg and reads the same number of bytes back.
func roundTrip(t testing.TB, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(buf) != msg {
		t.Fatalf("echo = %q, want %q", buf, msg)
	}
}

// assertGoodClient proves the server still serves a well-behaved client.
func assertGoodClient(t testing.TB, m *mesh, srv *testServer, echoAddr netip.AddrPort) {
	t.Helper()
	p := newPool(t, m)
	tun, err := p.Connect(testCtx(t), connectReq(srv, echoAddr))
	if err != nil {
		t.Fatalf("good client after bad input: %v", err)
	}
	defer tun.Close()
	roundTrip(t, tun, "still serving")
}

// waitFor polls cond until it holds or the test's patience runs out. It is
// for eventual states (a connection closing), never for timing.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, what, cond)
}

// checkErrText fails unless err's text follows the package's convention
// (see the package doc): "hbone: " once, at the front.
func checkErrText(t testing.TB, err error) {
	t.Helper()
	if s := err.Error(); !strings.HasPrefix(s, "hbone: ") || strings.Count(s, "hbone: ") != 1 {
		t.Errorf("error %q: want one \"hbone: \" prefix, at the front", s)
	}
}
