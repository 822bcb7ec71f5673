package waypoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry"
)

// One request on the fast path (h1.go): the same steps as serveHTTP —
// filters, fault, mirrors, the proxy with the route's retries and
// timeouts, stats — without net/http's server, ReverseProxy or Transport.

// serveRequest serves r, whose head was headLen bytes; false: close the
// connection after it.
func (c *h1Conn) serveRequest(r *http.Request, headLen int) (keep bool) {
	w := c.w
	start := time.Now()
	meta := c.tc.meta
	ex := &exchange{
		src: meta.src, dst: meta.dst, peer: meta.peer, baggage: meta.baggage, svc: meta.svc, protocol: meta.protocol,
		req: r, cfg: w.sink.cfg.Load(), snap: w.sink.Load(),
	}
	ex.attrs.HTTP, ex.attrs.Host, ex.attrs.Method, ex.attrs.Path = true, r.Host, r.Method, r.URL.Path
	defer w.endpointDone(context.Background(), ex, nil, nil) // an endpoint picked but never reached
	hdr := r.Header
	ex.attrs.Header = func(name string) (string, bool) {
		vs := hdr.Values(name)
		if len(vs) == 0 {
			return "", false
		}
		return vs[0], true
	}
	keep = !r.Close
	var body *countingBody
	if r.Body != nil && r.Body != http.NoBody {
		body = &countingBody{ReadCloser: r.Body}
		r.Body = body
	}
	reqSize := func() int64 {
		if body == nil {
			return int64(headLen)
		}
		return int64(headLen) + body.n.Load()
	}
	local := func(lr *localResponse, code int, flags string) bool {
		n, err := c.writeLocal(lr, keep)
		if err != nil {
			keep = false
		}
		w.record(ex, code, flags, time.Since(start), telemetry.Sizes{Request: reqSize(), Response: n})
		return keep
	}
	if err := w.decide(ex); err != nil {
		lr := newLocalResponse()
		code := answerRefusal(lr, r, ex, err)
		return local(lr, code, flagFor(code))
	}
	if ex.rule != nil && ex.rule.HasFault() {
		lr := newLocalResponse()
		if code, flags, done, why := w.router.InjectFault(ex.rule, lr, r); done {
			ex.err = why
			if code == 0 {
				keep = false
			}
			return local(lr, code, flags)
		}
	}
	if ex.rule != nil && ex.rule.HasMirrors() {
		ex.mirror = w.startMirrors(ex, r)
	}

	// The request upstream: its head, and the body held with it when it
	// is small (so one write carries both, and a retry can send it again).
	reqBuf := h1Bufs.Get()
	defer func() { h1Bufs.Put(reqBuf) }()
	var held []byte
	var stream io.Reader // what is left of the body to send after the head (nil: nothing)
	chunked := false
	switch {
	case body == nil:
	case r.GetBody != nil: // held by startMirrors
		b, _ := r.GetBody()
		held, _ = io.ReadAll(b)
	case r.ContentLength > 0 && r.ContentLength <= smallBodyMax, r.ContentLength < 0:
		hb := h1Bufs.Get()
		defer h1Bufs.Put(hb)
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
			lr := newLocalResponse()
			http.Error(lr, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			keep = false
			return local(lr, http.StatusBadRequest, "DPE")
		}
	default:
		stream = r.Body
	}
	c.upstreamHeader(ex, r)
	out := appendRequestHead(reqBuf[:0], r, held, stream != nil, chunked)
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
	for i := 0; i < attempts; i++ {
		if i > 0 {
			// Each retry may go to another endpoint of the backend.
			if err := w.routeTo(ex); err != nil {
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
		ex2 := c.roundTrip(ex, r, out, stream, chunked, dl)
		w.endpointDone(context.Background(), ex, ex2.resp, ex2.err) // outlier detection
		if ex2.err != nil {
			lastErr = ex2.err
			continue
		}
		resp := ex2.resp
		if i == attempts-1 || ex.rule == nil || !ex.rule.RetryOn(resp.StatusCode) {
			n, reuse, err := c.writeResponse(r, resp, ex2.up, keep)
			if !ex2.wait() {
				reuse, keep = false, false // the rest of the body is not read: close after this one
			}
			if err != nil {
				ex.err, keep = err, false
			}
			c.done(ex2.up, reuse, !dl.IsZero())
			w.record(ex, resp.StatusCode, "", time.Since(start), telemetry.Sizes{Request: reqSize(), Response: n})
			return keep
		}
		// Retried: drain what is small enough to keep the connection.
		_, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		reuse := err == nil && !resp.Close && isEOF(resp.Body)
		c.done(ex2.up, reuse, !dl.IsZero())
		lastErr = fmt.Errorf("upstream answered %d", resp.StatusCode)
	}
	code := http.StatusServiceUnavailable
	if isTimeout(lastErr) {
		code = http.StatusGatewayTimeout
	}
	ex.err = lastErr
	lr := newLocalResponse()
	http.Error(lr, http.StatusText(code), code)
	if stream != nil {
		keep = false // the body may be half sent and half read
	}
	return local(lr, code, flagFor(code))
}

// isEOF: the body has nothing more (a Read of nothing returns EOF).
func isEOF(r io.Reader) bool {
	var b [1]byte
	n, err := r.Read(b[:0])
	if n == 0 && err == nil {
		n, err = r.Read(b[:])
	}
	return n == 0 && err == io.EOF
}

// done returns an upstream connection after its exchange: kept when clean.
func (c *h1Conn) done(uc *upConn, reuse, deadline bool) {
	if deadline && reuse {
		reuse = uc.nc.SetDeadline(time.Time{}) == nil
	}
	if !reuse {
		uc.nc.Close()
		return
	}
	c.release(uc)
}

// upstreamHeader makes r's header the upstream request's, in place (the
// filters have read it): hop-by-hop fields out, the forwarding fields ours
// (as ReverseProxy's Rewrite with SetXForwarded and the HBONE Forwarded),
// then the route's header modifiers; framing is appendRequestHead's.
func (c *h1Conn) upstreamHeader(ex *exchange, r *http.Request) {
	h := r.Header
	removeHopByHop(h, true)
	delete(h, "X-Forwarded-For")
	delete(h, "X-Forwarded-Host")
	delete(h, "X-Forwarded-Proto")
	if c.xff == "" {
		// The same for every request of the tunnel (its source, its service).
		c.xff, c.fwd = ex.src.Addr().String(), hbone.BuildForwarded(ex.src, ex.attrs.Service)
	}
	vs := &[4]string{c.xff, r.Host, "http", c.fwd} // one allocation for the four
	h["X-Forwarded-For"] = vs[0:1:1]
	h["X-Forwarded-Host"] = vs[1:2:2]
	h["X-Forwarded-Proto"] = vs[2:3:3]
	h["Forwarded"] = vs[3:4:4]
	if ex.rule != nil {
		ex.rule.Modify(h)
	}
	delete(h, "Content-Length")
	delete(h, "Transfer-Encoding")
	delete(h, "Host")
}

// appendRequestHead writes the upstream request line, Host, header and
// framing: a held body's length, a streamed body's Content-Length or
// chunked, or for no body "Content-Length: 0" where net/http sends it.
func appendRequestHead(b []byte, r *http.Request, held []byte, streamed, chunked bool) []byte {
	b = append(b, r.Method...)
	b = append(b, ' ')
	b = append(b, r.URL.RequestURI()...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, r.Host...)
	b = append(b, "\r\n"...)
	b = appendHeaders(b, r.Header)
	switch {
	case streamed && chunked:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	case streamed:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, r.ContentLength, 10)
		b = append(b, "\r\n"...)
	case len(held) > 0 || r.Method != http.MethodGet && r.Method != http.MethodHead:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(held)), 10)
		b = append(b, "\r\n"...)
	}
	return append(b, "\r\n"...)
}

// attempt is one exchange with an endpoint: the response head (its body
// still to read on up) or the error; wait reports the streamed body's
// writer goroutine.
type attempt struct {
	resp *http.Response
	up   *upConn
	err  error
	body chan error // nil: the body went with the head
}

// wait waits for a streamed body's writer once the response is through;
// false: it failed, or was still writing and the connection was closed to
// end it (the endpoint answered without reading it all). Either way the
// connection is not reused.
func (a *attempt) wait() bool {
	if a.body == nil {
		return true
	}
	select {
	case err := <-a.body:
		return err == nil
	default:
	}
	a.up.nc.Close()
	<-a.body
	return false
}

// roundTrip sends the request to ex.target and reads the response head.
// A kept connection the endpoint had closed meanwhile is replaced once by
// a new one when the body can be sent again.
func (c *h1Conn) roundTrip(ex *exchange, r *http.Request, head []byte, stream io.Reader, chunked bool, deadline time.Time) attempt {
	for fresh := false; ; fresh = true {
		uc, err := c.upstream(ex.target, fresh, deadline)
		if err != nil {
			return attempt{err: timeoutErr(err)}
		}
		if !deadline.IsZero() {
			_ = uc.nc.SetDeadline(deadline) // cleared by done before the connection is kept
		}
		a := attempt{up: uc}
		_, err = uc.nc.Write(head)
		if err == nil && stream != nil {
			// Streamed: its own goroutine writes the body while this one
			// reads the response (which may come first).
			a.body = make(chan error, 1)
			go func() {
				err := copyBody(uc.nc, stream, chunked)
				if errors.Is(err, errBodyRead) {
					uc.nc.Close() // the endpoint would wait for the rest
				}
				a.body <- err
			}()
		}
		if err == nil {
			a.resp, err = readResponse(uc, r)
		}
		if err == nil {
			return a
		}
		uc.nc.Close()
		if a.body != nil {
			<-a.body
		}
		if uc.reused && stream == nil && !isTimeout(err) {
			continue // stale: try once on a new connection
		}
		return attempt{err: timeoutErr(fmt.Errorf("upstream %s: %w", ex.target, err))}
	}
}

// readResponse reads the response head, skipping 1xx informational ones (a
// 101 is refused: the fast path never asks for an upgrade).
func readResponse(uc *upConn, r *http.Request) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(uc.br, r)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, errors.New("unrequested 101 Switching Protocols")
		}
		if resp.StatusCode >= 200 || resp.StatusCode < 100 {
			return resp, nil
		}
	}
}

// timeoutErr makes a deadline's error one net/http's path would report
// (context.DeadlineExceeded: a 504 and the UT flag).
func timeoutErr(err error) error {
	if isTimeout(err) && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
	}
	return err
}
