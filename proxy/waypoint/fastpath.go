package waypoint

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/h1"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry/tracing"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/upstream"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/wire"
)

// The filter chain on the HTTP/1.1 fast path: package h1 reads each
// request of a tunnel and hands it here, which runs the same steps as
// serveHTTP (filters, fault, mirrors, the proxy with the route's retries
// and timeouts, stats) without net/http's server, ReverseProxy or
// Transport, and sends it upstream on the connections package upstream
// keeps.

// fastConn is one downstream connection's state on the fast path.
type fastConn struct {
	w    *Waypoint
	meta *tunnelMeta
	held *upstream.Held // upstream connections kept between this connection's requests
	// tlsHeld are the upstream connections of requests with TLS to
	// originate, one set per configuration, each with a pool of its own:
	// a connection verified for one host's SNI and SANs is never reused
	// for another host whose endpoint is the same address.
	tlsHeld map[*tls.Config]*tlsConns
	xff     string // X-Forwarded-For and Forwarded, once per tunnel
	fwd     string
}

// serveH1 serves the tunnel's requests on the fast path until it closes
// (true) or a request needs the net/http path (false: tc.pre holds the
// bytes read and not yet served, for the HTTP server to read first).
func (w *Waypoint) serveH1(tc *tunnelConn) (closed bool) {
	fc := &fastConn{w: w, meta: tc.meta, held: upstream.NewHeld(&w.upstreams, w.dialFast)}
	defer fc.held.Close()
	defer func() {
		for _, tc := range fc.tlsHeld {
			tc.held.Close()
			tc.pool.Close()
		}
	}()
	closed, pre := w.fast.Serve(tc, fc.serveRequest)
	if !closed {
		tc.pre = pre
		w.fallbacks.Add(1)
	}
	return closed
}

// tlsConns are a downstream connection's upstream connections for one TLS
// configuration.
type tlsConns struct {
	held *upstream.Held
	pool *upstream.Pool
}

// withTLS returns the connections of requests with TLS cfg to originate.
func (fc *fastConn) withTLS(cfg *tls.Config) *upstream.Held {
	if tc := fc.tlsHeld[cfg]; tc != nil {
		return tc.held
	}
	if fc.tlsHeld == nil {
		fc.tlsHeld = map[*tls.Config]*tlsConns{}
	}
	tc := &tlsConns{pool: &upstream.Pool{}}
	tc.held = upstream.NewHeld(tc.pool, func(ctx context.Context, target netip.AddrPort, forwarded string) (net.Conn, error) {
		return originateTLS(ctx, fc.w.dialFast, target, forwarded, cfg)
	})
	fc.tlsHeld[cfg] = tc
	return tc.held
}

// originateTLS opens a connection with dial and runs a TLS handshake over
// it as cfg says (DestinationRule tls SIMPLE or MUTUAL).
func originateTLS(ctx context.Context, dial upstream.DialFunc, target netip.AddrPort, forwarded string, cfg *tls.Config) (net.Conn, error) {
	c, err := dial(ctx, target, forwarded)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("waypoint: TLS origination to %s (SNI %s): %w", target, cfg.ServerName, err)
	}
	return tc, nil
}

// dialFast opens the fast path's upstream connections.
func (w *Waypoint) dialFast(ctx context.Context, target netip.AddrPort, forwarded string) (net.Conn, error) {
	if w.upstreamDial != nil {
		return w.upstreamDial(ctx, target, forwarded)
	}
	return w.dial(ctx, target, forwarded)
}

// serveRequest serves r, whose head c read (headLen bytes); false: close
// the connection after it.
func (fc *fastConn) serveRequest(c *h1.Conn, r *http.Request, headLen int) (keep bool) {
	w := fc.w
	start := time.Now()
	meta := fc.meta
	ex := &exchange{
		src: meta.src, dst: meta.dst, peer: meta.peer, principal: meta.principal, baggage: meta.baggage, svc: meta.svc, protocol: meta.protocol,
		req: r, cfg: w.sink.cfg.Load(), snap: w.sink.Load(),
	}
	ex.attrs.HTTP, ex.attrs.Host, ex.attrs.Method, ex.attrs.Path = true, r.Host, r.Method, r.URL.Path
	defer w.endpointDone(context.Background(), ex, nil, nil) // an endpoint picked but never reached
	hdr := r.Header
	// As Envoy's connection manager, before the filters: the request id,
	// and the span (nil, at no cost, when tracing is off).
	tracing.EnsureRequestID(hdr)
	ex.span = ex.cfg.tracingFor(ex.dst.Addr().Unmap()).Start(hdr, start)
	ex.attrs.Header = func(name string) (string, bool) {
		vs := hdr.Values(name)
		if len(vs) == 0 {
			return "", false
		}
		// Istio's normalization: duplicate headers are one value,
		// joined by commas.
		return strings.Join(vs, ","), true
	}
	keep = !r.Close
	var body *countingBody
	if r.Body != nil && r.Body != http.NoBody {
		ex.body.ReadCloser = r.Body
		body = &ex.body
		r.Body = body
	}
	sizes := func(respTotal int64) telemetry.Sizes {
		var b int64
		if body != nil {
			b = body.n.Load()
		}
		return telemetry.Sizes{Request: int64(headLen) + b, Response: respTotal, RequestBody: b, ResponseBody: c.BodySent()}
	}
	local := func(lr *h1.LocalResponse, code int, flags string) bool {
		n, err := c.WriteLocal(lr, keep)
		if err != nil {
			keep = false
		}
		w.record(ex, code, flags, time.Since(start), sizes(n))
		return keep
	}
	if err := w.decide(ex); err != nil {
		lr := h1.NewLocalResponse()
		code := answerRefusal(lr, r, ex, err)
		return local(lr, code, flagFor(code, err))
	}
	if ex.rule != nil && ex.rule.HasFault() {
		lr := h1.NewLocalResponse()
		if code, flags, done, why := w.router.InjectFault(ex.rule, lr, r); done {
			ex.err = why
			if code == 0 {
				keep = false
			}
			return local(lr, code, flags)
		}
	}
	if ex.edit.Answers() {
		// A redirect or a direct response: the rule's own answer.
		lr := h1.NewLocalResponse()
		code := ex.edit.Answer(lr, r, ex.dst.Port())
		return local(lr, code, "")
	}
	if ex.rule != nil && ex.rule.HasMirrors() {
		ex.mirror = w.startMirrors(ex, r)
	}

	// The request upstream: its head, and the body held with it when it
	// is small (so one write carries both, and a retry can send it again).
	reqBuf := wire.Bufs.Get()
	defer func() { wire.Bufs.Put(reqBuf) }()
	var held []byte
	var stream io.Reader // what is left of the body to send after the head (nil: nothing)
	chunked := false
	switch {
	case body == nil:
	case r.GetBody != nil: // held by startMirrors
		b, _ := r.GetBody()
		held, _ = io.ReadAll(b)
	case r.ContentLength > 0 && r.ContentLength <= smallBodyMax, r.ContentLength < 0:
		hb := wire.Bufs.Get()
		defer wire.Bufs.Put(hb)
		limit := smallBodyMax + 1
		if r.ContentLength > 0 {
			limit = int(r.ContentLength)
		}
		n, err := io.ReadFull(r.Body, hb[:limit])
		switch {
		case r.ContentLength > 0 && err == nil, r.ContentLength < 0 && (err == io.ErrUnexpectedEOF || err == io.EOF):
			held = hb[:n]
		case r.ContentLength < 0 && err == nil:
			stream, chunked = io.MultiReader(bytes.NewReader(hb[:n]), r.Body), true
		default:
			// A body cut short or with a bad chunk: nothing went upstream.
			ex.err = fmt.Errorf("reading the request body: %w", err)
			lr := h1.NewLocalResponse()
			http.Error(lr, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			keep = false
			return local(lr, http.StatusBadRequest, "DPE")
		}
	default:
		stream = r.Body
	}
	fc.upstreamHeader(ex, r)
	out := wire.AppendRequestHead(reqBuf[:0], r, held, stream != nil, chunked)
	out = append(out, held...)

	replayable := stream == nil
	attempts := 1
	if ex.rule != nil && replayable {
		attempts += ex.rule.Retries()
	}
	var deadline time.Time
	if ex.rule != nil && ex.rule.Timeout() > 0 {
		deadline = time.Now().Add(ex.rule.Timeout())
	}
	var lastErr error
	var retryHeld func() // a retry's place under maxRetries (circuit breaking)
	for i := 0; i < attempts; i++ {
		if i > 0 {
			// Each retry may go to another endpoint of the backend
			// the first attempt chose.
			if err := w.rerouteTo(ex); err != nil {
				lastErr = err
				break
			}
		}
		dl := deadline
		if ex.rule != nil && ex.rule.PerTry() > 0 {
			if pt := time.Now().Add(ex.rule.PerTry()); dl.IsZero() || pt.Before(dl) {
				dl = pt
			}
		}
		var lim upstream.Limits
		if pk := ex.picked; pk != nil {
			if err := w.router.Acquire(context.Background(), pk, ex.attrs.Service, false); err != nil {
				lastErr = err
				break
			}
			lim = upstream.Limits{ConnectTimeout: pk.ConnectTimeout(), MaxUses: pk.MaxRequestsPerConnection(), IdleTimeout: pk.IdleTimeout()}
		}
		held := fc.held
		if ex.tls != nil {
			held = fc.withTLS(ex.tls)
		}
		ex2 := held.RoundTrip(ex.target, r, out, stream, chunked, dl, lim)
		w.endpointDone(context.Background(), ex, ex2.Resp, ex2.Err) // outlier detection
		if retryHeld != nil {
			retryHeld()
			retryHeld = nil
		}
		if ex2.Err != nil {
			lastErr = ex2.Err
			if i < attempts-1 {
				ok, rel := w.router.RetryAdmit(ex.lastPicked)
				if !ok {
					break
				}
				retryHeld = rel
			}
			continue
		}
		resp := ex2.Resp
		retry := i < attempts-1 && ex.rule != nil && ex.rule.RetryOn(resp.StatusCode)
		if retry {
			retry, retryHeld = w.router.RetryAdmit(ex.lastPicked)
		}
		if !retry {
			if ex.setCookie != "" {
				resp.Header.Add("Set-Cookie", ex.setCookie)
			}
			if ex.edit.ModifiesResponse() {
				ex.edit.Response(resp.Header)
			}
			if stream != nil && !body.eof.Load() {
				// The endpoint answered before the client's body was all
				// read: the connection closes after this response, so say
				// so in it, or the client sends its next request on a
				// connection about to close and reads EOF.
				keep = false
			}
			n, reuse, err := c.WriteResponse(r, resp, keep)
			if !ex2.Wait() {
				// The body's writer failed or was cut off: the endpoint's
				// connection is done. The client's is still clean when its
				// body was read to the end before the response went out
				// (keep was decided above, and written in the response).
				reuse = false
			}
			if err != nil {
				ex.err, keep = err, false
			}
			held.Done(ex2.Conn, reuse, !dl.IsZero())
			ex.lastPicked.Release() // the response is through
			if ex.grpcStatus = resp.Trailer.Get("Grpc-Status"); ex.grpcStatus == "" {
				ex.grpcStatus = resp.Header.Get("Grpc-Status")
			}
			w.record(ex, resp.StatusCode, "", time.Since(start), sizes(n))
			return keep
		}
		// Retried: drain what is small enough to keep the connection.
		_, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		reuse := err == nil && !resp.Close && wire.IsEOF(resp.Body)
		held.Done(ex2.Conn, reuse, !dl.IsZero())
		ex.lastPicked.Release()
		lastErr = fmt.Errorf("upstream answered %d", resp.StatusCode)
	}
	if retryHeld != nil {
		retryHeld()
	}
	code := http.StatusServiceUnavailable
	if wire.IsTimeout(lastErr) {
		code = http.StatusGatewayTimeout
	}
	ex.err = lastErr
	lr := h1.NewLocalResponse()
	if isRefusal(lastErr) {
		code = answerRefusal(lr, r, ex, lastErr) // a circuit breaker's overflow
	} else {
		http.Error(lr, http.StatusText(code), code)
	}
	if stream != nil {
		keep = false // the body may be half sent and half read
	}
	return local(lr, code, flagFor(code, lastErr))
}

// upstreamHeader makes r's header the upstream request's, in place (the
// filters have read it): hop-by-hop fields out, the forwarding fields ours
// (as ReverseProxy's Rewrite with SetXForwarded and the HBONE Forwarded),
// then the route's header modifiers; framing is wire.AppendRequestHead's.
func (fc *fastConn) upstreamHeader(ex *exchange, r *http.Request) {
	h := r.Header
	wire.RemoveHopByHop(h, true)
	delete(h, "X-Forwarded-For")
	delete(h, "X-Forwarded-Host")
	delete(h, "X-Forwarded-Proto")
	if fc.xff == "" {
		// The same for every request of the tunnel (its source, its service).
		fc.xff, fc.fwd = ex.src.Addr().String(), hbone.BuildForwarded(ex.src, ex.attrs.Service)
	}
	vs := &[4]string{fc.xff, r.Host, "http", fc.fwd} // one allocation for the four
	h["X-Forwarded-For"] = vs[0:1:1]
	h["X-Forwarded-Host"] = vs[1:2:2]
	h["X-Forwarded-Proto"] = vs[2:3:3]
	h["Forwarded"] = vs[3:4:4]
	ex.span.Inject(h)     // the upstream's parent is the waypoint's span
	ex.edit.Request(r, h) // the route's header modifiers and URL rewrite
	delete(h, "Content-Length")
	delete(h, "Transfer-Encoding")
	delete(h, "Host")
}
