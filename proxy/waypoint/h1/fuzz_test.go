package h1

import (
	"bufio"
	"bytes"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/wire"
)

// FuzzH1HeadDifferential feeds the fast path's head parser (headEnd, then
// readRequest: scanHead, http.ReadRequest, checkRequest) and net/http's
// request reader (http.ReadRequest on a bufio.Reader) the same bytes and
// requires the same decision. Where both accept, the request must be the
// same (method, target, Host, header, framing, body), and the head the fast
// path sends upstream (wire.AppendRequestHead) must read back as that
// request: what the waypoint forwards is what it authorized.
//
// A head the fast path leaves to net/http (fallback: not HTTP/1.1, CONNECT,
// Upgrade, Expect, Trailer, larger than BufSize) is decided by net/http's
// own server, so it is not compared. The fast path is stricter than
// http.ReadRequest in these documented cases, each checked by reason:
//
//   - both Content-Length and Transfer-Encoding (RFC 9112 §6.3): net/http
//     drops the Content-Length and reads chunked; a proxy that forwards
//     such a head lets a peer that frames by Content-Length read a second,
//     smuggled request from the body (CL.TE);
//   - obsolete line folding (RFC 9112 §5.2): net/http joins the line to
//     the previous one; a peer that does not would see another header set
//     (a hidden Transfer-Encoding, say);
//   - a "scheme:opaque" request target (ServedTarget): net/http reads it
//     with an empty path, which routes and authorization would match,
//     while the opaque part is what would go upstream;
//   - no blank line before the end of input: net/http takes the header
//     lines read so far as the whole head; the fast path waits for the
//     blank line and, the client gone, answers nothing;
//   - what net/http's server refuses after http.ReadRequest, with the same
//     reasons (a missing or malformed Host, an invalid header name or
//     value): checkRequest does what the server does, and the fuzz target
//     asks a real http.Server that it refuses the same bytes.
//
// What the fast path serves, a real http.Server must serve too: the waypoint
// answers a request the same on either of its paths.
func FuzzH1HeadDifferential(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /x?y=1 HTTP/1.1\nHost: a.example:8080\nAccept: */*\n\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n folded\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX Y: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
		"GET http://b/ HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET http://b/ HTTP/1.1\r\nHost: a b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost:\r\n\r\n",
		"GET http://b HTTP/1.1\r\nHost: b\r\n\r\n",
		"GET a:b HTTP/1.1\r\nHost: b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
		"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		ref, refErr := http.ReadRequest(bufio.NewReader(bytes.NewReader(in)))

		br := bufio.NewReaderSize(bytes.NewReader(in), BufSize)
		buf, _ := br.Peek(min(len(in), BufSize))
		n := headEnd(buf)
		switch {
		case n == 0 && len(in) >= BufSize:
			return // too large for the buffer: net/http's server serves it
		case n == 0:
			// No blank line: the fast path waits for more and, at the end of
			// input, answers nothing and forwards nothing (documented above
			// where net/http reads a request).
			return
		}
		r, fallback, refusal := readRequest(br, buf[:n])
		if fallback {
			return
		}
		if refusal != "" {
			if refErr != nil {
				return // both refuse
			}
			switch refusal {
			case "both Content-Length and Transfer-Encoding", "obsolete line folding", "invalid request target":
				return // documented: stricter, a smuggling defence
			case "missing required Host header", "malformed Host header", "invalid header name", "invalid header value":
				if serverServes(t, in) {
					t.Fatalf("the fast path refuses %q (%s), net/http's server serves it", in, refusal)
				}
				return
			}
			t.Fatalf("the fast path refuses %q (%s), net/http reads %s %s", in, refusal, ref.Method, ref.RequestURI)
		}
		if refErr != nil {
			t.Fatalf("the fast path accepts %q, net/http refuses it: %v", in, refErr)
		}
		sameRequest(t, in, r, ref)
		forwardedSame(t, in, r)
		if !serverServes(t, in) {
			t.Fatalf("the fast path serves %q, net/http's server refuses it", in)
		}
	})
}

// sameRequest fails unless the fast path read the request net/http read.
func sameRequest(t *testing.T, in []byte, r, ref *http.Request) {
	t.Helper()
	if r.Method != ref.Method || r.RequestURI != ref.RequestURI || *r.URL != *ref.URL || r.Host != ref.Host || r.Proto != ref.Proto ||
		r.ContentLength != ref.ContentLength || !slices.Equal(r.TransferEncoding, ref.TransferEncoding) || r.Close != ref.Close ||
		!maps.EqualFunc(r.Header, ref.Header, slices.Equal) {
		t.Fatalf("%q: the fast path read %s %s host %q %v cl %d te %v, net/http %s %s host %q %v cl %d te %v", in,
			r.Method, r.RequestURI, r.Host, r.Header, r.ContentLength, r.TransferEncoding,
			ref.Method, ref.RequestURI, ref.Host, ref.Header, ref.ContentLength, ref.TransferEncoding)
	}
	b, err := io.ReadAll(r.Body)
	rb, rerr := io.ReadAll(ref.Body)
	if !bytes.Equal(b, rb) || (err == nil) != (rerr == nil) {
		t.Fatalf("%q: bodies differ: %q (%v), net/http %q (%v)", in, b, err, rb, rerr)
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	if err != nil {
		r.Body = nil // cut short: nothing goes upstream
	}
}

// forwardedSame writes r's head as the fast path sends it upstream (hop-by-
// hop fields out, the body held with its length) and reads it back: the
// endpoint must see the method, target, Host, header and body the filters
// saw, and nothing after them.
func forwardedSame(t *testing.T, in []byte, r *http.Request) {
	t.Helper()
	if r.Body == nil {
		return
	}
	body, _ := io.ReadAll(r.Body)
	h := r.Header.Clone()
	wire.RemoveHopByHop(h, true)
	delete(h, "Content-Length")
	delete(h, "Transfer-Encoding")
	delete(h, "Host")
	out := *r
	out.Header = h
	head := wire.AppendRequestHead(nil, &out, body, false, false)
	up := bufio.NewReader(bytes.NewReader(append(head, body...)))
	got, err := http.ReadRequest(up)
	if err != nil {
		t.Fatalf("%q: the head sent upstream does not read back: %v\n%q", in, err, head)
	}
	gb, err := io.ReadAll(got.Body)
	// The target goes upstream in origin form (an absolute-form target's
	// authority is the Host already, RFC 9112 §3.2.2).
	if err != nil || !bytes.Equal(gb, body) || got.Method != r.Method || got.RequestURI != r.URL.RequestURI() || got.Host != r.Host ||
		len(got.TransferEncoding) > 0 || !maps.EqualFunc(got.Header, withLength(h, got.Header), slices.Equal) {
		t.Fatalf("%q: upstream reads %s %s host %q %v body %q (%v), want %s %s host %q %v body %q\n%q", in,
			got.Method, got.RequestURI, got.Host, got.Header, gb, err, r.Method, r.URL.RequestURI(), r.Host, h, body, head)
	}
	if _, err := up.Peek(1); err != io.EOF {
		t.Fatalf("%q: bytes after the forwarded request: a second request upstream\n%q", in, head)
	}
}

// withLength is h with the Content-Length the forwarded head carries (got
// has it when one was written).
func withLength(h, got http.Header) http.Header {
	if v, ok := got["Content-Length"]; ok {
		h = h.Clone()
		h["Content-Length"] = v
	}
	return h
}

// serverServes reports whether net/http's server hands the request in to
// its handler: one connection of in, served by a real http.Server.
func serverServes(t *testing.T, in []byte) bool {
	t.Helper()
	var served atomic.Bool
	srv := &http.Server{
		// Only the first request counts; the bytes after it may read as more.
		Handler:  http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Store(true) }),
		ErrorLog: log.New(io.Discard, "", 0),
	}
	c := &inputConn{r: bytes.NewReader(in), closed: make(chan struct{})}
	l := &oneConnListener{c: c, done: make(chan struct{})}
	go func() { _ = srv.Serve(l) }()
	select {
	case <-c.closed:
	case <-time.After(5 * time.Second):
		t.Fatalf("net/http's server kept %q open", in)
	}
	_ = srv.Close()
	return served.Load()
}

// inputConn is a connection that reads in, then EOF, and drops what is
// written.
type inputConn struct {
	r      *bytes.Reader
	once   sync.Once
	closed chan struct{}
}

func (c *inputConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *inputConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *inputConn) Close() error                     { c.once.Do(func() { close(c.closed) }); return nil }
func (c *inputConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *inputConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *inputConn) SetDeadline(time.Time) error      { return nil }
func (c *inputConn) SetReadDeadline(time.Time) error  { return nil }
func (c *inputConn) SetWriteDeadline(time.Time) error { return nil }

// oneConnListener accepts c once, then waits until closed.
type oneConnListener struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
	used bool
	mu   sync.Mutex
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.used {
		l.used = true
		l.mu.Unlock()
		return l.c, nil
	}
	l.mu.Unlock()
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *oneConnListener) Addr() net.Addr { return &net.TCPAddr{} }
