package hbone

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

var gatewayID = identity.MustNew("cluster.local", "istio-system", "eastwest-gateway")

// tapConn records every byte that passes through a connection both ways,
// as a network gateway in the middle of double HBONE sees them. It hides
// the socket (no syscall.Conn), so the splice cannot bypass it.
type tapConn struct {
	net.Conn
	tcp  *net.TCPConn
	mu   sync.Mutex
	seen bytes.Buffer
}

func (c *tapConn) CloseWrite() error { return c.tcp.CloseWrite() }

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.seen.Write(p[:n])
	c.mu.Unlock()
	return n, err
}

func (c *tapConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.seen.Write(p)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *tapConn) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.seen.Bytes())
}

// doubleFixture is double HBONE in one process: a final HBONE server
// (serverID) whose handler echoes, and a gateway HBONE server (gatewayID)
// that terminates the outer CONNECT and forwards its raw bytes over TCP to
// the final server, tapping them.
type doubleFixture struct {
	m        *mesh
	final    *testServer
	gateway  *testServer
	mu       sync.Mutex
	outer    []*Request // what the gateway was asked
	inner    []*Request // what the final server was asked
	taps     []*tapConn
	outerEnd chan error // one per outer stream that ended
}

func newDoubleFixture(t *testing.T) *doubleFixture {
	t.Helper()
	f := &doubleFixture{m: newMesh(t), outerEnd: make(chan error, 16)}
	gw, err := f.m.ca.Issue(gatewayID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f.m.certs.Set(gw)
	echoUp := startUpstream(t, echo)
	f.final = startServer(t, f.m, HandlerFunc(func(ctx context.Context, req *Request) Reply {
		f.mu.Lock()
		f.inner = append(f.inner, req)
		f.mu.Unlock()
		up, err := net.Dial("tcp", echoUp.addr.String())
		if err != nil {
			return Reply{Status: 503}
		}
		return Reply{Upstream: up, Baggage: "k8s.workload.name=final"}
	}), func(c *ServerConfig) { c.AcceptHostnames = true })
	f.gateway = startServer(t, f.m, HandlerFunc(func(ctx context.Context, req *Request) Reply {
		up, err := net.Dial("tcp", f.final.addr.String())
		if err != nil {
			return Reply{Status: 503}
		}
		tap := &tapConn{Conn: up, tcp: up.(*net.TCPConn)}
		f.mu.Lock()
		f.outer = append(f.outer, req)
		f.taps = append(f.taps, tap)
		f.mu.Unlock()
		return Reply{Upstream: tap, Done: func(_ TunnelStats, err error) { f.outerEnd <- err }}
	}), func(c *ServerConfig) { c.Identity, c.AcceptHostnames = gatewayID, true })
	return f
}

// requests are the two CONNECTs of one double HBONE connection to
// reviews.default.svc.cluster.local:9080 from network "west".
func (f *doubleFixture) requests(finalIDs ...identity.Identity) (outer, inner *ConnectRequest) {
	outer = &ConnectRequest{
		Key: Key{
			Src:     clientID,
			Dst:     []identity.Identity{gatewayID},
			SrcIP:   netip.MustParseAddr("127.0.0.1"),
			NextHop: f.gateway.addr,
		},
		Host:      "reviews.default.svc.cluster.local",
		Authority: netip.AddrPortFrom(netip.Addr{}, 9080),
		Forwarded: `for="10.0.0.1:5555";host=reviews.default.svc.cluster.local`,
	}
	in := *outer
	in.Key = Key{Src: clientID, Dst: finalIDs, SrcIP: outer.SrcIP, NextHop: f.gateway.addr}
	in.Baggage = "k8s.namespace.name=client-ns"
	in.ForwardedNetwork = "west"
	return outer, &in
}

func (f *doubleFixture) seen() (outer, inner []*Request, taps []*tapConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Request(nil), f.outer...), append([]*Request(nil), f.inner...), append([]*tapConn(nil), f.taps...)
}

func TestConnectThroughGateway(t *testing.T) {
	f := newDoubleFixture(t)
	p := newPool(t, f.m)
	outer, inner := f.requests(serverID)
	tun, err := p.ConnectThrough(testCtx(t), outer, inner)
	if err != nil {
		t.Fatalf("ConnectThrough: %v", err)
	}
	roundTrip(t, tun, "hello across networks")
	if got := tun.PeerIdentity(); got != serverID {
		t.Errorf("inner PeerIdentity = %s, want the final destination %s", got, serverID)
	}
	if got := tun.ResponseBaggage(); got != "k8s.workload.name=final" {
		t.Errorf("ResponseBaggage = %q, want the final server's", got)
	}

	outs, ins, _ := f.seen()
	if len(outs) != 1 || len(ins) != 1 {
		t.Fatalf("gateway saw %d CONNECTs, final server %d; want 1 each", len(outs), len(ins))
	}
	o, i := outs[0], ins[0]
	if o.Host != "reviews.default.svc.cluster.local" || o.Authority.Port() != 9080 {
		t.Errorf("outer authority = %q port %d, want reviews.default.svc.cluster.local:9080", o.Host, o.Authority.Port())
	}
	if o.Peer != clientID {
		t.Errorf("gateway saw peer %s, want the client %s", o.Peer, clientID)
	}
	if o.HasForwardedNetwork {
		t.Errorf("outer CONNECT carries x-forwarded-network %q; Istio sends it on the inner one only", o.ForwardedNetwork)
	}
	if i.Peer != clientID {
		t.Errorf("final server saw peer %s through the inner mTLS, want the client %s", i.Peer, clientID)
	}
	if i.Host != "reviews.default.svc.cluster.local" || i.Authority.Port() != 9080 {
		t.Errorf("inner authority = %q port %d, want reviews.default.svc.cluster.local:9080", i.Host, i.Authority.Port())
	}
	if i.ForwardedNetwork != "west" || !i.HasForwardedNetwork {
		t.Errorf("inner x-forwarded-network = %q, want west", i.ForwardedNetwork)
	}
	if i.Baggage != "k8s.namespace.name=client-ns" || i.Forwarded != inner.Forwarded || i.Traceparent == "" {
		t.Errorf("inner headers baggage=%q forwarded=%q traceparent=%q, want the request's", i.Baggage, i.Forwarded, i.Traceparent)
	}
	// The final server's TCP peer is the gateway's forwarding socket, not
	// the client: the inner connection really went through the gateway.
	if ra, la := i.RemoteAddr.String(), f.gateway.addr.String(); ra == la {
		t.Fatalf("inner RemoteAddr %s is the gateway listener", ra)
	}

	// Closing the inner tunnel ends the single-use inner connection and,
	// with it, the outer stream at the gateway.
	tun.Close()
	select {
	case <-f.outerEnd:
	case <-time.After(10 * time.Second):
		t.Fatal("outer stream still open at the gateway after the inner tunnel closed")
	}
	if n := p.NumConns(); n != 1 {
		t.Errorf("pool holds %d connections, want 1 (the outer one, pooled)", n)
	}
}

// TestConnectThroughDefaultNetwork: a source on the default network ("")
// still sends x-forwarded-network on the inner CONNECT, empty, as Istio's
// ztunnel does: a destination on a named network then knows the client
// came through a gateway.
func TestConnectThroughDefaultNetwork(t *testing.T) {
	f := newDoubleFixture(t)
	p := newPool(t, f.m)
	outer, inner := f.requests(serverID)
	inner.ForwardedNetwork = ""
	tun, err := p.ConnectThrough(testCtx(t), outer, inner)
	if err != nil {
		t.Fatalf("ConnectThrough: %v", err)
	}
	roundTrip(t, tun, "x")
	tun.Close()
	_, ins, _ := f.seen()
	if len(ins) != 1 || !ins[0].HasForwardedNetwork || ins[0].ForwardedNetwork != "" {
		t.Fatalf("inner CONNECTs %+v, want one with an empty x-forwarded-network", ins)
	}
}

// TestConnectThroughGatewaySeesCiphertext: the gateway forwards TLS
// records; neither the payload nor the inner headers appear in what it
// relays.
func TestConnectThroughGatewaySeesCiphertext(t *testing.T) {
	f := newDoubleFixture(t)
	p := newPool(t, f.m)
	outer, inner := f.requests(serverID)
	tun, err := p.ConnectThrough(testCtx(t), outer, inner)
	if err != nil {
		t.Fatalf("ConnectThrough: %v", err)
	}
	const secret = "payload-the-gateway-must-not-read"
	roundTrip(t, tun, secret)
	tun.Close()
	<-f.outerEnd
	_, _, taps := f.seen()
	if len(taps) != 1 {
		t.Fatalf("gateway forwarded %d streams, want 1", len(taps))
	}
	raw := taps[0].bytes()
	if len(raw) < 5 || raw[0] != 0x16 || raw[1] != 0x03 {
		t.Fatalf("relayed bytes start % x, want a TLS handshake record (16 03 ..)", raw[:min(len(raw), 5)])
	}
	for _, plain := range []string{secret, "x-forwarded-network", "west", "client-ns", "PRI * HTTP/2.0"} {
		if bytes.Contains(raw, []byte(plain)) {
			t.Errorf("gateway relayed %q in plaintext", plain)
		}
	}
}

// TestConnectThroughInnerNotPooled: every call opens its own inner mTLS
// connection (over a stream of one pooled outer connection), so a gateway
// balancing per stream can reach several remote endpoints.
func TestConnectThroughInnerNotPooled(t *testing.T) {
	f := newDoubleFixture(t)
	var handshakes sync.Map
	p := newPool(t, f.m, func(c *PoolConfig) {
		c.OnHandshake = func(k Key) {
			n, _ := handshakes.LoadOrStore(k.Dst[0], new(int))
			*n.(*int)++
		}
	})
	outer, inner := f.requests(serverID)
	var tuns []*Tunnel
	for range 3 {
		tun, err := p.ConnectThrough(testCtx(t), outer, inner)
		if err != nil {
			t.Fatalf("ConnectThrough: %v", err)
		}
		roundTrip(t, tun, "x")
		tuns = append(tuns, tun)
	}
	for _, tun := range tuns {
		tun.Close()
	}
	count := func(id identity.Identity) int {
		n, ok := handshakes.Load(id)
		if !ok {
			return 0
		}
		return *n.(*int)
	}
	if g, i := count(gatewayID), count(serverID); g != 1 || i != 3 {
		t.Errorf("handshakes: gateway %d, final %d; want 1 outer (pooled) and 3 inner (one per tunnel)", g, i)
	}
	_, ins, _ := f.seen()
	remotes := map[string]bool{}
	for _, r := range ins {
		remotes[r.RemoteAddr.String()] = true
	}
	if len(remotes) != 3 {
		t.Errorf("final server saw inner CONNECTs on %d connections, want 3", len(remotes))
	}
}

// TestConnectThroughWrongFinalIdentity: the inner handshake verifies the
// final destination, not the gateway; a mismatch fails closed and ends the
// outer stream.
func TestConnectThroughWrongFinalIdentity(t *testing.T) {
	f := newDoubleFixture(t)
	p := newPool(t, f.m)
	other := identity.MustNew("cluster.local", "default", "ratings")
	outer, inner := f.requests(other)
	_, err := p.ConnectThrough(testCtx(t), outer, inner)
	if !errors.Is(err, ErrIdentityMismatch) || !errors.Is(err, ErrHandshake) {
		t.Fatalf("ConnectThrough with the wrong final identity: %v, want ErrIdentityMismatch", err)
	}
	checkErrText(t, err)
	select {
	case <-f.outerEnd:
	case <-time.After(10 * time.Second):
		t.Fatal("outer stream still open after the inner handshake failed")
	}
	if _, ins, _ := f.seen(); len(ins) != 0 {
		t.Errorf("final server got %d CONNECTs, want none", len(ins))
	}
}

// TestConnectThroughGatewayRefuses: a refused outer CONNECT is Connect's
// *StatusError; nothing is dialled inside.
func TestConnectThroughGatewayRefuses(t *testing.T) {
	f := newDoubleFixture(t)
	refusing := startServer(t, f.m, HandlerFunc(func(context.Context, *Request) Reply { return Reply{Status: 401} }),
		func(c *ServerConfig) { c.Identity, c.AcceptHostnames = gatewayID, true })
	p := newPool(t, f.m)
	outer, inner := f.requests(serverID)
	outer.NextHop = refusing.addr
	_, err := p.ConnectThrough(testCtx(t), outer, inner)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 401 {
		t.Fatalf("ConnectThrough to a refusing gateway: %v, want StatusError 401", err)
	}
}
