package waypoint

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// connLimits are a DestinationRule's per-connection settings on net/http's
// path (maxRequestsPerConnection, http.idleTimeout): requests with them go
// through transports of their own, one pair per distinct setting, so the
// shared transports keep the waypoint's defaults.
type connLimits struct {
	maxUses int
	idle    time.Duration
}

// limitedTransports is one pair of transports for a connLimits.
type limitedTransports struct {
	h1 *http.Transport
	h2 *http2.Transport
}

// usedConn counts the requests an upstream HTTP/1.1 connection carried.
type usedConn struct {
	net.Conn
	uses atomic.Int64
}

// transportsFor returns the transports for l, built on first use.
func (w *Waypoint) transportsFor(l connLimits) *limitedTransports {
	if t, ok := w.limited.Load(l); ok {
		return t.(*limitedTransports)
	}
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, err
		}
		c, err := w.dialUpstream(ctx, ap)
		if err != nil {
			return nil, err
		}
		return &usedConn{Conn: c}, nil
	}
	idle := l.idle
	if idle == 0 {
		idle = 90 * time.Second
	}
	t := &limitedTransports{
		h1: &http.Transport{
			DialContext:         func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
			MaxIdleConnsPerHost: 64, IdleConnTimeout: idle, DisableKeepAlives: l.maxUses == 1,
		},
		h2: &http2.Transport{
			AllowHTTP: true, IdleConnTimeout: l.idle,
			DialTLSContext: func(ctx context.Context, _, addr string, _ *tls.Config) (net.Conn, error) { return dial(ctx, addr) },
		},
	}
	got, _ := w.limited.LoadOrStore(l, t)
	return got.(*limitedTransports)
}

// closeLimited closes the idle connections of every limited transport.
func (w *Waypoint) closeLimited() {
	w.limited.Range(func(_, v any) bool {
		t := v.(*limitedTransports)
		t.h1.CloseIdleConnections()
		t.h2.CloseIdleConnections()
		return true
	})
}

// countStreams makes req, sent on HTTP/2 as *sent, the last request of
// the connection that carries it when that is its maxUses-th: the hook
// runs before x/net starts the stream, and a request with Close set marks
// its connection not to be reused, which then closes once its streams end
// (Envoy drains it so).
func countStreams(req *http.Request, maxUses int, sent **http.Request) *http.Request {
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if c, ok := info.Conn.(*usedConn); ok && c.uses.Add(1) >= int64(maxUses) && *sent != nil {
			(*sent).Close = true
		}
	}}
	return req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
}

// countUses makes req report the HTTP/1.1 connection that carries it when
// that is its maxUses-th request: *last is set then, and the caller closes
// it once the response is through.
func countUses(req *http.Request, maxUses int, last **usedConn) *http.Request {
	var mu sync.Mutex
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if c, ok := info.Conn.(*usedConn); ok && c.uses.Add(1) >= int64(maxUses) {
			mu.Lock()
			*last = c
			mu.Unlock()
		}
	}}
	return req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
}
