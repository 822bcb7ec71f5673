// Package h1 is the downstream side of the waypoint's HTTP/1.1 fast path,
// Envoy's HTTP/1.1 codec. A tunnel to an HTTP (not HTTP2) port is served
// here, on the goroutine that serves the tunnel, instead of by net/http's
// server, ReverseProxy and Transport: each request's head is read once
// and handed to the filter chain (a Handler, which the root package
// proxy/waypoint assembles: the same filters as its net/http path), which
// sends it upstream (package upstream) and writes the response with
// WriteResponse on the same goroutine: no per-connection read and write
// loops, no channel hand-offs, no deep header copy. A head in a plain
// subset (quickRequest) is read without http.ReadRequest, to the same
// *http.Request; any other with it.
//
// What it does not do goes to the net/http path (Serve returns the bytes
// already read, which the HTTP server reads first), for
// the rest of that connection: a request head that is not HTTP/1.1 (h2c
// prior knowledge "PRI * HTTP/2.0", HTTP/1.0), CONNECT, Upgrade (WebSocket, h2c
// upgrade), Expect (100-continue), request trailers (a Trailer header),
// and a head larger than the read buffer (BufSize). gRPC and HTTP2
// ports never start here. A head the fast path refuses (RFC 9112 framing
// it will not guess at) is answered 400 and the connection closed:
// Content-Length with Transfer-Encoding, differing Content-Lengths, an
// obsolete folded header line, a malformed head (http.ReadRequest's own
// checks: bad chunk sizes surface when the body is read, a held body
// before anything goes upstream).
package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http/httpguts"
)

// BufSize is the downstream read buffer: a request head must fit in it
// to be served on the fast path.
const BufSize = 8 << 10

// errFallback: the connection goes to the net/http path from this request on.
var errFallback = errors.New("waypoint: request needs the net/http path")

var h1Readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, BufSize) }}

// Tunnel is the downstream connection: an HBONE tunnel, which can
// half-close.
type Tunnel interface {
	net.Conn
	CloseWrite() error
}

// Handler serves one request whose head (headLen bytes) c read: it
// answers with c.WriteLocal or c.WriteResponse, and returns false to close
// the connection after it. Its body, if any, is r.Body; what the handler
// leaves of it is read and dropped before the next request.
type Handler func(c *Conn, r *http.Request, headLen int) (keep bool)

// Server is the fast path's set of downstream connections: Shutdown
// closes the idle ones.
type Server struct {
	log     *zap.Logger
	mu      sync.Mutex
	conns   map[*Conn]struct{}
	closing atomic.Bool
}

// NewServer returns a Server logging refused requests to log.
func NewServer(log *zap.Logger) *Server { return &Server{log: log} }

// Conn is one downstream HTTP/1.1 connection on the fast path.
type Conn struct {
	srv   *Server
	tc    Tunnel
	br    *bufio.Reader
	serve Handler
	idle  atomic.Bool // between requests: Shutdown closes it
	// bodySent: the body bytes of the last response written.
	bodySent int64
}

// BodySent is how many body bytes the last WriteResponse or WriteLocal
// wrote (what Envoy's %BYTES_SENT% counts, the head left out).
func (c *Conn) BodySent() int64 { return c.bodySent }

// Serve serves the tunnel's requests with serve until it closes (closed) or
// a request needs the net/http path (pre holds the bytes read and not yet
// served, for the HTTP server to read first).
func (s *Server) Serve(tc Tunnel, serve Handler) (closed bool, pre []byte) {
	c := &Conn{srv: s, tc: tc, serve: serve, br: h1Readers.Get().(*bufio.Reader)}
	c.br.Reset(tc)
	if !s.track(c, true) {
		tc.Close()
		return true, nil
	}
	defer func() {
		s.track(c, false)
		c.br.Reset(nil)
		h1Readers.Put(c.br)
	}()
	for {
		err := c.serveOne()
		if err == nil {
			continue
		}
		if errors.Is(err, errFallback) {
			// The HTTP server reads what is buffered first, then the tunnel.
			b, _ := c.br.Peek(c.br.Buffered())
			return false, bytes.Clone(b)
		}
		if errors.Is(err, io.EOF) {
			tc.Close() // the client closed first
		} else {
			closeWriteAndWait(tc)
		}
		return true, nil
	}
}

// closeWriteAndWait closes as net/http's server does when it ends a
// connection itself: the write side first, so the client reads the last
// response whole, then (after the client closes, or half a second) the
// tunnel; closing at once would reset it under the response.
func closeWriteAndWait(tc Tunnel) {
	_ = tc.CloseWrite()
	_ = tc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.Copy(io.Discard, io.LimitReader(tc, 256<<10))
	tc.Close()
}

// track adds (or removes) a fast-path connection to the set Shutdown
// closes when idle; false: the waypoint is shutting down.
func (s *Server) track(c *Conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.conns, c)
		return true
	}
	if s.closing.Load() {
		return false
	}
	if s.conns == nil {
		s.conns = map[*Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	return true
}

// setIdle marks the connection between requests (an idle one Shutdown
// closes); false: it is shutting down, close it.
func (c *Conn) setIdle(idle bool) bool {
	c.idle.Store(idle)
	return !c.srv.closing.Load()
}

// Shutdown stops the fast path taking new requests and closes its idle
// connections; busy ones close after their response.
func (s *Server) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing.Store(true)
	for c := range s.conns {
		if c.idle.Load() {
			// The client reads EOF and closes, which ends the goroutine's
			// wait for the next request; one that does not is closed in a
			// second.
			_ = c.tc.CloseWrite()
			time.AfterFunc(time.Second, func() { c.tc.Close() })
		}
	}
}

// Close closes every fast-path connection.
func (s *Server) Close() {
	s.mu.Lock()
	s.closing.Store(true)
	for c := range s.conns {
		c.tc.Close()
	}
	s.mu.Unlock()
}

// serveOne reads and serves one request. nil: the connection stays open
// for the next; errFallback: hand it to the net/http path; other: close.
func (c *Conn) serveOne() error {
	if !c.setIdle(true) {
		return errShuttingDown
	}
	if _, err := c.br.Peek(1); err != nil {
		return err // the client closed (or reset) between requests
	}
	if !c.setIdle(false) {
		return errShuttingDown
	}
	head, err := c.peekHead()
	if err != nil {
		return err
	}
	r, fallback, refusal := readRequest(c.br, head)
	if fallback {
		return errFallback
	}
	if refusal != "" {
		c.refuse(refusal)
		return errors.New("waypoint: refused request: " + refusal)
	}
	keep := c.serve(c, r, len(head))
	if !keep || !c.finishBody(r) {
		return errConnDone
	}
	return nil
}

var (
	errConnDone     = errors.New("waypoint: connection done")
	errShuttingDown = errors.New("waypoint: shutting down")
)

// peekHead returns the request head (through its blank line) from the
// read buffer without consuming it, reading more while it is incomplete.
// A head that does not fit the buffer: errFallback.
func (c *Conn) peekHead() ([]byte, error) {
	deadline := false
	defer func() {
		if deadline {
			_ = c.tc.SetReadDeadline(time.Time{})
		}
	}()
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		if n := headEnd(buf); n > 0 {
			return buf[:n], nil
		}
		if len(buf) >= c.br.Size() {
			return nil, errFallback
		}
		if !deadline {
			// As the HTTP server's ReadHeaderTimeout, once a head has begun.
			deadline = true
			_ = c.tc.SetReadDeadline(time.Now().Add(30 * time.Second))
		}
		if _, err := c.br.Peek(len(buf) + 1); err != nil {
			return nil, err
		}
	}
}

// headEnd is the length of the head in b through the empty line that ends
// it (lines end in LF or CRLF, as net/textproto reads them); 0: incomplete.
func headEnd(b []byte) int {
	for i, first := 0, true; ; first = false {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0
		}
		line := b[i : i+j]
		i += j + 1
		if !first && (len(line) == 0 || len(line) == 1 && line[0] == '\r') {
			return i
		}
	}
}

// readRequest is the fast path's decision on the request whose head is at
// the start of br (head: its bytes through the blank line, as peekHead
// found them): the request, its body still to read from br; fallback, the
// net/http path serves it; or why it is refused with 400.
// FuzzH1HeadDifferential holds it to net/http's decision on the same bytes.
func readRequest(br *bufio.Reader, head []byte) (r *http.Request, fallback bool, refusal string) {
	info := scanHead(head)
	if info.fallback {
		return nil, true, ""
	}
	if info.bad != "" {
		return nil, false, info.bad
	}
	r = quickRequest(head, br)
	if r != nil {
		_, _ = br.Discard(len(head)) // peeked: buffered
	} else {
		var err error
		if r, err = http.ReadRequest(br); err != nil {
			return nil, false, err.Error()
		}
	}
	if msg := checkRequest(r, &info); msg != "" {
		return nil, false, msg
	}
	return r, false, ""
}

// headInfo is what scanHead learns from a raw request head.
type headInfo struct {
	fallback bool   // the net/http path serves it
	bad      string // refused with 400: why
	// hosts counts the Host lines; badHost: the first one's value is not
	// a valid host. http.ReadRequest deletes the Host field from the
	// header it returns, so only the raw head tells an empty Host from
	// none, and the field from an absolute-form target's authority.
	hosts   int
	badHost bool
}

// scanHead reads the raw head for what http.ReadRequest would accept but the
// fast path must not forward as parsed (request smuggling: RFC 9112 §6.3,
// §11.2), and for what it leaves to the net/http path.
func scanHead(head []byte) headInfo {
	var info headInfo
	first := true
	var cl []byte
	te := false
	for len(head) > 0 {
		j := bytes.IndexByte(head, '\n')
		line := head[:j]
		head = head[j+1:]
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if first {
			first = false
			if !bytes.HasSuffix(line, []byte(" HTTP/1.1")) || bytes.HasPrefix(line, []byte("CONNECT ")) {
				// HTTP/1.0, h2c prior knowledge ("PRI * HTTP/2.0"), CONNECT,
				// or malformed: net/http answers.
				info.fallback = true
				return info
			}
			continue
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			info.bad = "obsolete line folding"
			return info
		}
		k := bytes.IndexByte(line, ':')
		if k < 0 {
			continue // http.ReadRequest refuses it
		}
		name, value := line[:k], bytes.TrimSpace(line[k+1:])
		switch {
		case asciiEqualFold(name, "content-length"):
			if cl != nil && !bytes.Equal(cl, value) {
				info.bad = "differing Content-Length headers"
				return info
			}
			cl = value
		case asciiEqualFold(name, "transfer-encoding"):
			te = true
		case asciiEqualFold(name, "host"):
			info.hosts++
			if info.hosts == 1 {
				info.badHost = !httpguts.ValidHostHeader(string(trimSP(line[k+1:])))
			}
		case asciiEqualFold(name, "upgrade"), asciiEqualFold(name, "expect"), asciiEqualFold(name, "trailer"):
			info.fallback = true
			return info
		}
	}
	if cl != nil && te {
		info.bad = "both Content-Length and Transfer-Encoding"
	}
	return info
}

// trimSP trims spaces and tabs, as net/textproto trims a field value.
func trimSP(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// checkRequest is what net/http's server checks of a parsed request
// before its handler runs ("": fine), given what scanHead saw of its Host
// lines: an HTTP/1.1 request needs a Host field, possibly empty (RFC 9112
// §3.2), whose value is a valid host, even when an absolute-form target
// names the authority instead. More than one Host is http.ReadRequest's
// own refusal.
func checkRequest(r *http.Request, info *headInfo) string {
	if info.hosts == 0 {
		return "missing required Host header"
	}
	if info.hosts == 1 && info.badHost {
		return "malformed Host header"
	}
	if !ServedTarget(r.URL) {
		return "invalid request target"
	}
	for k, vs := range r.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return "invalid header name"
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return "invalid header value"
			}
		}
	}
	return ""
}

// ServedTarget reports whether a request target is one the waypoint
// serves: origin-form ("/path"), absolute-form with scheme http or https
// and a path, or "*". The filters (routes, authorization) match URL.Path
// and the target sent upstream is URL.RequestURI(): for these forms the
// two name the same path. net/http also reads "scheme:opaque" targets,
// whose path is empty while the opaque part would go upstream, and
// "http://host", whose empty path would go upstream as "/"; such a request
// is refused instead.
func ServedTarget(u *url.URL) bool {
	if u.Opaque != "" {
		return false
	}
	switch u.Scheme {
	case "":
		return u.Path == "*" || strings.HasPrefix(u.Path, "/")
	case "http", "https":
		return strings.HasPrefix(u.Path, "/")
	}
	return false
}

// refuse answers a request that cannot be served 400, as net/http's server
// does, and the connection closes.
func (c *Conn) refuse(why string) {
	c.srv.log.Debug("refused an HTTP/1.1 request", zap.String("reason", why))
	body := "400 Bad Request: " + why
	_, _ = io.WriteString(c.tc, "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body)
}

// finishBody reads what is left of a request body so the next request can
// be read, as net/http's server does (up to 256 KiB; more: close).
func (c *Conn) finishBody(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return true
	}
	n, err := io.CopyN(io.Discard, r.Body, 256<<10+1)
	return n <= 256<<10 && errors.Is(err, io.EOF)
}
