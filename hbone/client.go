package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"golang.org/x/net/http2/hpack"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// DefaultPort is the HBONE port.
const DefaultPort = 15008

// DefaultConnectTimeout bounds TCP connect plus TLS handshake.
const DefaultConnectTimeout = 10 * time.Second

// DialFunc opens the TCP connection to nextHop, from srcIP when srcIP is
// valid. The proxy passes one that creates the socket in the source pod's
// network namespace with SO_MARK; the default is DefaultDial.
type DialFunc func(ctx context.Context, srcIP netip.Addr, nextHop netip.AddrPort) (net.Conn, error)

// DefaultDial dials with net.Dialer, binding srcIP when it is valid and not
// unspecified, with TCP_NODELAY and Istio's TCP keepalive (180 s idle,
// 180 s interval, 9 probes).
func DefaultDial(ctx context.Context, srcIP netip.Addr, nextHop netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{KeepAliveConfig: tcpKeepalive}
	if srcIP.IsValid() && !srcIP.IsUnspecified() {
		d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(srcIP, 0))
	}
	return d.DialContext(ctx, "tcp", nextHop.String())
}

var tcpKeepalive = net.KeepAliveConfig{Enable: true, Idle: 180 * time.Second, Interval: 180 * time.Second, Count: 9}

// Key identifies the connections a stream may share: two requests
// share an mTLS connection only if all four fields are equal.
type Key struct {
	Src     identity.Identity   // source workload identity: the client certificate
	Dst     []identity.Identity // acceptable server identities, in order
	SrcIP   netip.Addr          // source workload IP the connection is bound to
	NextHop netip.AddrPort      // where the connection goes (usually ip:15008)
}

// ConnectRequest is one CONNECT: the pool key plus what goes in the
// request. Empty header fields are not sent, except Traceparent, which is
// generated when empty.
type ConnectRequest struct {
	Key
	Authority netip.AddrPort // :authority, the inner target ip:port
	// Host, when set, names the target service by hostname instead: the
	// :authority is Host:<Authority's port> (Authority's address unused),
	// for a server with ServerConfig.AcceptHostnames.
	Host        string
	Baggage     string // "baggage" header (see Baggage.String)
	Forwarded   string // "forwarded" header (see BuildForwarded)
	Traceparent string // "traceparent" header; "" means a new random one
	// ForwardedNetwork is the "x-forwarded-network" header: the source's
	// network, sent on the inner CONNECT of double HBONE so the destination
	// knows the client came through a network gateway. Connect sends it
	// when not ""; ConnectThrough sends it on the inner CONNECT always,
	// empty for the default network, as Istio's ztunnel does (the
	// receiver compares it with its own network).
	ForwardedNetwork string
	// sendNetwork sends ForwardedNetwork even when empty.
	sendNetwork bool
}

// ClientConfig is what an outbound HBONE connection needs.
type ClientConfig struct {
	// Certs supplies the source workload's certificate and trust bundle. Required.
	Certs identity.CertSource
	// Dial opens the TCP connection; nil means DefaultDial.
	Dial DialFunc
	// H2 tunes HTTP/2; the zero value is Istio's settings.
	H2 H2Settings
	// ConnectTimeout bounds TCP connect plus TLS handshake; 0 means 10 s.
	ConnectTimeout time.Duration
	// OnHandshake, if set, is called before every TLS handshake (tests and
	// metrics count them).
	OnHandshake func(Key)
	// Revocation refuses servers with a revoked certificate and closes
	// connections whose server it revokes later; nil means none.
	Revocation Revocation
}

// ClientConn is one outbound HBONE connection. Most callers use a Pool;
// ClientConn is for callers that must not share (for example the inner
// connection of double HBONE).
type ClientConn struct {
	c *conn
}

// Dial opens an HBONE connection for key.
func Dial(ctx context.Context, cfg *ClientConfig, key Key) (*ClientConn, error) {
	c, err := dialConn(ctx, context.Background(), cfg, nil, key, nil, nil)
	if err != nil {
		return nil, err
	}
	return &ClientConn{c: c}, nil
}

// DialOver is Dial over an established stream instead of a new TCP
// connection: the inner connection of double HBONE, whose TLS and HTTP/2
// run inside an outer tunnel (over) to a network gateway, which forwards
// the bytes unread. key.Dst is the final destination's identities;
// key.NextHop only labels errors (pass the gateway's address). The
// connection owns over: a failed dial and Close close it.
func DialOver(ctx context.Context, cfg *ClientConfig, over net.Conn, key Key) (*ClientConn, error) {
	c, err := dialConn(ctx, context.Background(), cfg, nil, key, over, nil)
	if err != nil {
		return nil, err
	}
	return &ClientConn{c: c}, nil
}

// Connect opens a tunnel to req.Authority (req.Key is ignored: the
// connection is already chosen). It returns a *StatusError for a non-200
// answer.
func (cc *ClientConn) Connect(ctx context.Context, req *ConnectRequest) (*Tunnel, error) {
	if !cc.c.reserve(maxStreamID) {
		return nil, fmt.Errorf("hbone: %w: no new streams", ErrConnClosed)
	}
	return cc.c.connect(ctx, req)
}

// PeerIdentity is the server's verified identity.
func (cc *ClientConn) PeerIdentity() identity.Identity { return cc.c.peer }

// Close closes the connection and every tunnel on it.
func (cc *ClientConn) Close() error {
	cc.c.closeGracefully()
	return nil
}

// Done is closed when the connection has ended.
func (cc *ClientConn) Done() <-chan struct{} { return cc.c.done }

// dialConn dials and handshakes; setup, if set, runs on the new conn
// before its read loop starts (to install hooks). With over set it dials
// nothing and runs TLS over that stream (DialOver), which it then owns.
func dialConn(ctx, base context.Context, cfg *ClientConfig, cache *verifyCache, key Key, over net.Conn, setup func(*conn)) (*conn, error) {
	timeout := cfg.ConnectTimeout
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hop := key.NextHop.String()
	if over != nil {
		hop += " (inner tunnel)"
	}
	fail := func(err error) (*conn, error) {
		if over != nil {
			over.Close()
		}
		return nil, err
	}
	if len(key.Dst) == 0 {
		return fail(fmt.Errorf("hbone: connect %s: no expected server identity", hop))
	}
	wc, err := cfg.Certs.Fetch(ctx, key.Src)
	if err != nil {
		return fail(fmt.Errorf("hbone: certificate for %s: %w", key.Src, err))
	}
	raw := over
	var rc *rawConn
	if raw == nil {
		dial := cfg.Dial
		if dial == nil {
			dial = DefaultDial
		}
		if raw, err = dial(ctx, key.SrcIP, key.NextHop); err != nil {
			return nil, connectErr(ctx, hop, timeout, err)
		}
		rc = newRawConn(raw)
	}
	if cfg.OnHandshake != nil {
		cfg.OnHandshake(key)
	}
	var peer identity.Identity
	var tc *tls.Conn
	if rc != nil {
		tc = tls.Client(rc, clientTLSConfig(wc, key.Dst, &peer, cache, cfg.Revocation))
	} else {
		// A tunnel is no socket: rawConn's batching and polled reads do not
		// apply, and TLS records go straight into DATA frames.
		tc = tls.Client(raw, clientTLSConfig(wc, key.Dst, &peer, cache, cfg.Revocation))
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		if ctx.Err() != nil {
			return nil, connectErr(ctx, hop, timeout, err)
		}
		return nil, fmt.Errorf("hbone: connect %s: %w: %w", hop, ErrHandshake, err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != alpnH2 {
		raw.Close()
		return nil, fmt.Errorf("hbone: connect %s: %w: server negotiated ALPN %q, want h2", hop, ErrHandshake, p)
	}
	c := newConn(tc, true, cfg.H2, peer, base)
	c.raw = rc
	c.over = over
	if setup != nil {
		setup(c)
	}
	if err := c.start(); err != nil {
		return nil, fmt.Errorf("hbone: connect %s: %w", hop, err)
	}
	// In TLS 1.3 the server checks our certificate after our side of the
	// handshake is done; its SETTINGS tell us it accepted it. Waiting for
	// them turns a rejection into a handshake error here instead of a reset
	// on the first stream.
	select {
	case <-c.ready:
		if cfg.Revocation != nil {
			// Only then: an AfterFunc runs on a goroutine of its own when
			// c ends, and a pool's connections often end together (their
			// idle timeouts), each leaving a goroutine descriptor Go keeps.
			context.AfterFunc(c.ctx, watchRevoked(cfg.Revocation, c, tc.ConnectionState().PeerCertificates, false))
		}
		return c, nil
	case <-c.done:
		return nil, fmt.Errorf("hbone: connect %s: %w: server closed the connection before its SETTINGS: %w",
			hop, ErrHandshake, c.closedErr())
	case <-ctx.Done():
		c.fail(ctx.Err())
		return nil, connectErr(ctx, hop, timeout, ctx.Err())
	}
}

func connectErr(ctx context.Context, hop string, timeout time.Duration, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("hbone: connect %s: %w (after %s): %w", hop, ErrConnectTimeout, timeout, err)
	}
	return fmt.Errorf("hbone: connect %s: %w", hop, err)
}

// authority is the :authority value the request sends.
func (req *ConnectRequest) authority() string {
	if req.Host != "" {
		return req.Host + ":" + strconv.Itoa(int(req.Authority.Port()))
	}
	return req.Authority.String()
}

// connect sends a CONNECT on a connection where the caller reserved a slot
// and waits for the answer.
func (c *conn) connect(ctx context.Context, req *ConnectRequest) (*Tunnel, error) {
	tp := req.Traceparent
	if tp == "" {
		tp = NewTraceparent()
	}
	var fa [6]hpack.HeaderField
	fields := append(fa[:0],
		hpack.HeaderField{Name: ":method", Value: "CONNECT"},
		hpack.HeaderField{Name: ":authority", Value: req.authority()},
	)
	if req.Baggage != "" {
		fields = append(fields, hpack.HeaderField{Name: "baggage", Value: req.Baggage})
	}
	if req.Forwarded != "" {
		fields = append(fields, hpack.HeaderField{Name: "forwarded", Value: req.Forwarded, Sensitive: true})
	}
	fields = append(fields, hpack.HeaderField{Name: "traceparent", Value: tp, Sensitive: true})
	if req.ForwardedNetwork != "" || req.sendNetwork {
		fields = append(fields, hpack.HeaderField{Name: "x-forwarded-network", Value: req.ForwardedNetwork})
	}

	c.wmu.Lock()
	c.mu.Lock()
	if c.closed || c.closing || c.nextID > maxStreamID {
		err := c.streamErrLocked()
		if c.closeErr == nil {
			// A graceful end (GOAWAY, idle expiry) raced our reservation:
			// nothing was sent, another connection may take the stream.
			err = fmt.Errorf("%w: %w", err, errRetry)
		}
		c.mu.Unlock()
		c.wmu.Unlock()
		c.unreserve()
		return nil, err
	}
	t := c.newTunnelLocked(c.nextID)
	t.counted = true
	c.nextID += 2
	c.streams[t.id] = t
	c.mu.Unlock()
	err := c.writeHeadersLocked(t.id, false, fields...)
	c.wmu.Unlock()
	if err != nil {
		t.Close()
		return nil, c.streamErr()
	}

	c.mu.Lock()
	for t.status == 0 {
		if t.err != nil {
			err := t.err
			c.mu.Unlock()
			t.Close()
			return nil, err
		}
		c.mu.Unlock()
		select {
		case <-t.rnotify:
		case <-ctx.Done():
			t.Close()
			return nil, fmt.Errorf("hbone: CONNECT %s via %s: %w", req.authority(), c.nc.RemoteAddr(), ctx.Err())
		}
		c.mu.Lock()
	}
	status := t.status
	c.mu.Unlock()
	t.wakeRead() // the notification we consumed may have carried data too
	if status != 200 {
		t.Close()
		return nil, &StatusError{Code: status}
	}
	return t, nil
}

// classifyConnErr marks TLS alerts that arrive after the client's side of
// a TLS 1.3 handshake finished (the server rejected our certificate) as
// handshake failures.
func classifyConnErr(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "remote error" {
		return fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	return err
}
