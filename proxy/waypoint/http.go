package waypoint

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/h1"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/routing"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry/tracing"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/wire"
)

// tunnelMeta is what the HBONE CONNECT told us, carried to every request
// served inside that tunnel.
type tunnelMeta struct {
	src, dst netip.AddrPort
	peer     identity.Identity
	// principal: peer.String(), once for every request of the tunnel.
	principal string
	baggage   hbone.Baggage
	svc       *boundService
	protocol  waypointapi.Protocol
}

// tunnelConn is the HTTP server's end of a tunnel (the *hbone.Tunnel
// itself: no socket pair and copy loops between): RemoteAddr is the
// original client, so forwarded headers name it.
type tunnelConn struct {
	net.Conn
	meta *tunnelMeta
	pre  []byte // read before the tunnel: what the fast path read and hands on (fastpath.go)
	once sync.Once
	done chan struct{} // closed by Close
}

func (c *tunnelConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes the tunnel (net/http ends a response this way
// before it closes, so the client reads it whole).
func (c *tunnelConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Close ends the tunnel as a TCP close would (cleanly after both
// half-closes, else a reset) and lets serveTunnel return.
func (c *tunnelConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

// serveTunnelPre serves the tunnel's HTTP/1.1 requests on the fast path
// (fastpath.go), and hands it to the HTTP server (HTTP/2, h2c, what the fast path
// leaves to net/http) and returns once the server has closed it
// (hbone.Reply.Serve). pre is what protocol detection already read from
// the tunnel, served first.
func (w *Waypoint) serveTunnelPre(t *hbone.Tunnel, meta *tunnelMeta, pre []byte) error {
	tc := &tunnelConn{Conn: t, meta: meta, pre: pre, done: make(chan struct{})}
	if meta.protocol != waypointapi.Protocol_HTTP2 && !w.slowPath && w.serveH1(tc) {
		return nil
	}
	if !w.httpLn.push(tc) {
		return net.ErrClosed
	}
	<-tc.done
	return nil
}

func (c *tunnelConn) RemoteAddr() net.Addr { return net.TCPAddrFromAddrPort(c.meta.src) }
func (c *tunnelConn) LocalAddr() net.Addr  { return net.TCPAddrFromAddrPort(c.meta.dst) }

// connListener hands tunnels to the HTTP server.
type connListener struct {
	ch     chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *connListener) push(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.closed:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return &net.UnixAddr{Name: "waypoint-tunnels", Net: "unix"} }

type metaKey struct{}
type exKey struct{}

// connectTimeoutKey: a request's DestinationRule connectTimeout, for the
// transports' dials.
type connectTimeoutKey struct{}

func (w *Waypoint) initHTTP() {
	w.httpLn = newConnListener()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			ex := pr.In.Context().Value(exKey{}).(*exchange)
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", ex.target.String()
			if ex.tls != nil {
				pr.Out.URL.Scheme = "https" // w.h1tls
			}
			pr.Out.Host = pr.In.Host
			// The original source, as Envoy's waypoint forwards it.
			pr.SetXForwarded()
			pr.Out.Header.Set("Forwarded", hbone.BuildForwarded(ex.src, ex.attrs.Service))
			ex.span.Inject(pr.Out.Header) // the upstream's parent is the waypoint's span
			ex.edit.Request(pr.Out, pr.Out.Header)
		},
		ModifyResponse: func(resp *http.Response) error {
			ex, ok := resp.Request.Context().Value(exKey{}).(*exchange)
			if ok && ex.edit.ModifiesResponse() {
				ex.edit.Response(resp.Header)
			}
			if ok && ex.setCookie != "" {
				resp.Header.Add("Set-Cookie", ex.setCookie)
			}
			return nil
		},
		Transport: &retrier{w: w},
		// 0, not -1: a response of known length goes out in one write with
		// its headers (-1 flushed the headers, then every body write, each
		// a tunnel frame, and started a flush goroutine per request);
		// ReverseProxy still flushes every write of a streaming response
		// (no Content-Length: gRPC, chunked, text/event-stream).
		FlushInterval: 0,
		BufferPool:    &wire.BufferPool{},
		ErrorHandler: func(rw http.ResponseWriter, r *http.Request, err error) {
			ex := r.Context().Value(exKey{}).(*exchange)
			if isRefusal(err) {
				answerRefusal(rw, r, ex, err) // a circuit breaker's overflow
				return
			}
			ex.err = err
			code := http.StatusServiceUnavailable
			if errors.Is(err, context.DeadlineExceeded) {
				code = http.StatusGatewayTimeout
			}
			http.Error(rw, http.StatusText(code), code)
		},
		ErrorLog: zap.NewStdLog(w.log.Named("http")),
	}
	w.h1 = &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, err
			}
			return w.dialUpstream(ctx, ap)
		},
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	w.h1tls = &http.Transport{
		DialTLSContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, err
			}
			ex, _ := ctx.Value(exKey{}).(*exchange)
			if ex == nil || ex.tls == nil {
				return nil, errors.New("waypoint: no TLS configuration for an https upstream")
			}
			return originateTLS(ctx, func(ctx context.Context, target netip.AddrPort, _ string) (net.Conn, error) {
				return w.dialUpstream(ctx, target)
			}, ap, "", ex.tls)
		},
		// Not kept: its pool is by address, and hosts with different SNI
		// and SANs may share an endpoint address.
		DisableKeepAlives: true,
	}
	w.h2 = &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, _, addr string, _ *tls.Config) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, err
			}
			return w.dialUpstream(ctx, ap)
		},
	}
	handler := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { w.serveHTTP(rw, r, proxy) })
	w.httpSrv = &http.Server{
		Handler: h2c.NewHandler(handler, &http2.Server{}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tunnelConn); ok {
				return context.WithValue(ctx, metaKey{}, tc.meta)
			}
			return ctx
		},
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          zap.NewStdLog(w.log.Named("http")),
	}
	w.wg.Add(2)
	go func() {
		defer w.wg.Done()
		_ = w.httpSrv.Serve(w.httpLn)
	}()
	go func() {
		defer w.wg.Done()
		w.upstreams.ReapUntil(w.httpLn.closed)
	}()
}

// dialUpstream opens an upstream connection for net/http's transports.
func (w *Waypoint) dialUpstream(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
	if d, ok := ctx.Value(connectTimeoutKey{}).(time.Duration); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	if w.upstreamDial != nil {
		return w.upstreamDial(ctx, ap, "")
	}
	return w.dial(ctx, ap, "")
}

// serveHTTP is one request: the filters (decide), then the proxy, then stats.
func (w *Waypoint) serveHTTP(rw http.ResponseWriter, r *http.Request, proxy http.Handler) {
	start := time.Now()
	meta, _ := r.Context().Value(metaKey{}).(*tunnelMeta)
	if meta == nil {
		http.Error(rw, "not a tunnel", http.StatusInternalServerError)
		return
	}
	ex := &exchange{
		src: meta.src, dst: meta.dst, peer: meta.peer, principal: meta.principal, baggage: meta.baggage, svc: meta.svc, protocol: meta.protocol,
		h2: r.ProtoMajor == 2, req: r, cfg: w.sink.cfg.Load(), snap: w.sink.Load(),
	}
	ex.attrs.HTTP, ex.attrs.Host, ex.attrs.Method, ex.attrs.Path = true, r.Host, r.Method, r.URL.Path
	defer w.endpointDone(r.Context(), ex, nil, nil) // an endpoint picked but never reached
	// As Envoy's connection manager, before the filters: the request id,
	// and the span (nil when tracing is off).
	tracing.EnsureRequestID(r.Header)
	ex.span = ex.cfg.tracingFor(ex.dst.Addr().Unmap()).Start(r.Header, start)
	ex.attrs.Header = func(name string) (string, bool) {
		vs := r.Header.Values(name)
		if len(vs) == 0 {
			return "", false
		}
		// Istio's normalization: duplicate headers are one value,
		// joined by commas.
		return strings.Join(vs, ","), true
	}
	sw := &statusWriter{ResponseWriter: rw}
	body := &countingBody{ReadCloser: r.Body}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = body
	}
	sizes := func() telemetry.Sizes {
		// Request line "METHOD target HTTP/x.y\r\n" and the Host header.
		req := int64(len(r.Method)+len(r.URL.RequestURI())+len(r.Proto)+4) + int64(len("Host: \r\n")+len(r.Host)) + telemetry.HeaderBytes(r.Header) + body.n.Load()
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		// Status line "HTTP/1.1 200 OK\r\n".
		resp := int64(len("HTTP/1.1 000 \r\n")+len(http.StatusText(code))) + telemetry.HeaderBytes(sw.Header()) + sw.n
		return telemetry.Sizes{Request: req, Response: resp, RequestBody: body.n.Load(), ResponseBody: sw.n}
	}
	record := func(code int, flags string, d time.Duration, sizes telemetry.Sizes) {
		ex.grpcStatus = grpcStatus(sw.Header())
		w.record(ex, code, flags, d, sizes)
	}
	if r.ProtoMajor == 1 && !h1.ServedTarget(r.URL) {
		// As the fast path refuses it: the filters would match one path
		// and the endpoint be sent another (HTTP/2 servers refuse such a
		// :path themselves).
		ex.err = fmt.Errorf("invalid request target %q", r.RequestURI)
		http.Error(sw, "400 Bad Request: invalid request target", http.StatusBadRequest)
		record(http.StatusBadRequest, "DPE", time.Since(start), sizes())
		return
	}
	if err := w.decide(ex); err != nil {
		code := answerRefusal(sw, r, ex, err)
		record(code, flagFor(code, err), time.Since(start), sizes())
		return
	}
	if code, flags, done, why := w.router.InjectFault(ex.rule, sw, r); done {
		ex.err = why
		record(code, flags, time.Since(start), sizes())
		return
	}
	if ex.edit.Answers() {
		// A redirect or a direct response: the rule's own answer.
		code := ex.edit.Answer(sw, r, ex.dst.Port())
		w.record(ex, code, "", time.Since(start), sizes())
		return
	}
	if ex.rule != nil && ex.rule.HasMirrors() {
		ex.mirror = w.startMirrors(ex, r)
	}
	if r.GetBody == nil {
		holdSmallBody(r)
	}
	ctx := context.WithValue(r.Context(), exKey{}, ex)
	if ex.rule != nil && ex.rule.Timeout() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ex.rule.Timeout())
		defer cancel()
	}
	proxy.ServeHTTP(sw, r.WithContext(ctx))
	code := sw.code
	if code == 0 {
		code = http.StatusOK
	}
	flags := ""
	if ex.err != nil {
		flags = flagFor(code, ex.err)
	}
	record(code, flags, time.Since(start), sizes())
}

// smallBodyMax is the largest request body (of known length) read before
// the request goes upstream.
const smallBodyMax = 16 << 10

// holdSmallBody reads a request body of known length up to smallBodyMax
// into memory and makes it replayable. net/http then writes the request
// line, headers and body upstream in one write (one HBONE frame: with a
// streamed body it flushes the headers first, a frame and a syscall more,
// 10 % of the waypoint's CPU in bench/waypoint), and a retry can send the
// body again, as Envoy buffers a request for its retries. A body it cannot
// read is left for the proxy to fail on.
func holdSmallBody(r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength <= 0 || r.ContentLength > smallBodyMax {
		return
	}
	b := make([]byte, r.ContentLength)
	n, err := io.ReadFull(r.Body, b)
	if err != nil {
		// Short or failed: hand the proxy what was read and the rest.
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(b[:n]), r.Body), r.Body}
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// statusWriter remembers the status and counts the body bytes for stats.
type statusWriter struct {
	http.ResponseWriter
	code int
	n    int64
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	s.n += int64(n)
	return n, err
}

// countingBody counts the request body bytes the proxy read.
// The transport may still be reading it when the handler returns (an
// HTTP/2 response can come before the request body ends): n is atomic.
type countingBody struct {
	io.ReadCloser
	n   atomic.Int64
	eof atomic.Bool // the client's body was read to its end
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// retrier sends a request upstream over HTTP/1.1 or h2c, retrying per the route rule: on a retryable status or a
// connect failure, while attempts remain and the body can be replayed.
type retrier struct{ w *Waypoint }

func (rt *retrier) RoundTrip(r *http.Request) (*http.Response, error) {
	ex := r.Context().Value(exKey{}).(*exchange)
	// HTTP/2 upstream for an HTTP2 (grpc, http2) port, and for an HTTP port
	// when the client spoke HTTP/2: the downstream protocol is kept, as
	// Envoy does for sniffed ports, or gRPC (trailers) could not pass.
	base := rt.w.h1
	switch {
	case ex.tls != nil:
		// HTTP/1.1 over the TLS the waypoint originates (ALPN http/1.1).
		base = rt.w.h1tls
	case ex.protocol == waypointapi.Protocol_HTTP2 || ex.h2:
		base = rt.w.h2
	}
	attempts := 1
	if ex.rule != nil && (r.Body == nil || r.Body == http.NoBody || r.GetBody != nil) {
		attempts += ex.rule.Retries()
	}
	var lastErr error
	var lastUse *usedConn  // the connection that carried its maxRequestsPerConnection-th request
	var sent *http.Request // the attempt's request as sent (countStreams marks it)
	var retryHeld func()   // a retry's place under maxRetries (circuit breaking)
	defer func() {
		if retryHeld != nil {
			retryHeld()
		}
	}()
	for i := 0; i < attempts; i++ {
		req := r
		if i > 0 {
			// Each retry may go to another endpoint of the backend
			// the first attempt chose.
			if err := rt.w.rerouteTo(ex); err != nil {
				return nil, err
			}
			req = r.Clone(r.Context())
			req.URL.Host = ex.target.String()
		}
		tr := base // this attempt's transport
		if pk := ex.picked; pk != nil {
			if err := rt.w.router.Acquire(r.Context(), pk, ex.attrs.Service, base == rt.w.h2); err != nil {
				return nil, err
			}
			if d := pk.ConnectTimeout(); d > 0 {
				req = req.WithContext(context.WithValue(req.Context(), connectTimeoutKey{}, d))
			}
			if l := (connLimits{maxUses: pk.MaxRequestsPerConnection(), idle: pk.IdleTimeout()}); l != (connLimits{}) {
				// Per-connection settings: transports of their own.
				lt := rt.w.transportsFor(l)
				if base == rt.w.h2 {
					tr = lt.h2
					if l.maxUses > 0 {
						req = countStreams(req, l.maxUses, &sent)
					}
				} else {
					tr = lt.h1
					if l.maxUses > 1 {
						req = countUses(req, l.maxUses, &lastUse)
					}
				}
			}
		}
		if r.GetBody != nil {
			// A body held in memory (holdSmallBody, mirroring) goes as
			// itself, on the first attempt too: ReverseProxy's wrapper hides
			// that from net/http, which then writes the headers on their own.
			b, err := r.GetBody()
			if err != nil {
				return nil, err
			}
			if req == r {
				req = r.WithContext(r.Context())
			}
			req.Body = b
		}
		ctx, cancel := context.WithCancel(req.Context())
		var timer *time.Timer
		if ex.rule != nil && ex.rule.PerTry() > 0 {
			timer = time.AfterFunc(ex.rule.PerTry(), cancel)
		}
		sent = req.WithContext(ctx)
		resp, err := tr.RoundTrip(sent)
		rt.w.endpointDone(r.Context(), ex, resp, err) // outlier detection
		if timer != nil {
			timer.Stop()
		}
		last := i == attempts-1
		if rwc, ok := resp.Body.(io.ReadWriteCloser); err == nil && resp.StatusCode == http.StatusSwitchingProtocols && ok {
			// An upgrade: ReverseProxy needs a body it can write to (the
			// connection itself, as the Transport hands it over).
			resp.Body = &cancelRWBody{ReadWriteCloser: rwc, cancel: cancel}
			ex.lastPicked.Release()
			return resp, nil
		}
		if retryHeld != nil {
			retryHeld() // the retry that just ended
			retryHeld = nil
		}
		retry := !last && ex.rule != nil && (err != nil || ex.rule.RetryOn(resp.StatusCode))
		if retry {
			// maxRetries: a retry it refuses is not sent; the last answer stands.
			retry, retryHeld = rt.w.router.RetryAdmit(ex.lastPicked)
		}
		if err == nil && !retry {
			resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel, picked: ex.lastPicked, last: lastUse}
			return resp, nil
		}
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			ex.lastPicked.Release()
			if lastUse != nil {
				lastUse.Close()
				lastUse = nil
			}
			lastErr = fmt.Errorf("upstream answered %d", resp.StatusCode)
		} else {
			lastErr = err
		}
		cancel()
		if !retry {
			break
		}
	}
	return nil, lastErr
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
	picked *routing.Picked // released when the body is through (circuit breakers)
	last   *usedConn       // closed when the body is through: its last request (maxRequestsPerConnection)
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	b.picked.Release()
	if b.last != nil {
		b.last.Close()
	}
	return err
}

// cancelRWBody is an upgraded connection's body: ReverseProxy writes to it.
type cancelRWBody struct {
	io.ReadWriteCloser
	cancel context.CancelFunc
}

func (b *cancelRWBody) Close() error {
	err := b.ReadWriteCloser.Close()
	b.cancel()
	return err
}

// startMirrors sends the copies of r the rule's mirrors ask for, in the
// protocol the client spoke, and says what it did for the access log.
func (w *Waypoint) startMirrors(ex *exchange, r *http.Request) string {
	base := w.h1
	if ex.h2 {
		base = w.h2
	}
	return w.router.StartMirrors(ex.rule, ex.snap, ex.src, ex.dst, r, base)
}

// grpcStatus is a response's grpc-status: a trailer (ReverseProxy sets
// trailers in the header map, under http.TrailerPrefix when they were not
// announced) or the header of a trailers-only response; "" when none.
func grpcStatus(h http.Header) string {
	if v := h.Get("Grpc-Status"); v != "" {
		return v
	}
	return h.Get(http.TrailerPrefix + "Grpc-Status")
}
