// Package wire is the HTTP/1.1 text the waypoint's fast path writes and
// the buffers it writes it with, shared by the downstream side (h1) and
// the upstream connections (upstream): header lines, hop-by-hop fields,
// chunked framing, request heads.
package wire

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/net/http/httpguts"
)

// BufferPool lends 32 KiB buffers. ReverseProxy copies responses with them:
// without a pool it allocates 32 KiB per request, 5 % of the waypoint's CPU
// at 1k req/s in bench/waypoint, plus the GC work. The pool holds pointers
// to the buffers' arrays: putting a slice (or a new pointer to one) in a
// sync.Pool boxes it, an allocation per Put, four to five per request on
// the fast path.
type BufferPool struct{ p sync.Pool }

const bufSize = 32 << 10

// Get returns a buffer of 32 KiB.
func (b *BufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[bufSize]byte); ok {
		return v[:]
	}
	return make([]byte, bufSize)
}

// Put returns buf for another Get. A slice that does not start a 32 KiB
// buffer (cut from its front, or not from Get) is left to the collector.
func (b *BufferPool) Put(buf []byte) {
	if cap(buf) != bufSize {
		return
	}
	b.p.Put((*[bufSize]byte)(buf[:bufSize]))
}

// Bufs lends the fast path its 32 KiB head and body buffers.
var Bufs BufferPool

// hopHeaders are the hop-by-hop fields (RFC 9110 §7.6.1), with the
// Proxy-* ones and Transfer-Encoding (framing is each hop's own).
var hopHeaders = [...]string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// RemoveHopByHop deletes the hop-by-hop fields and those the Connection
// field names; keepTE keeps "TE: trailers" (a request's, as ReverseProxy).
func RemoveHopByHop(h http.Header, keepTE bool) {
	for _, f := range h["Connection"] {
		for f != "" {
			var tok string
			tok, f, _ = strings.Cut(f, ",")
			if tok = strings.TrimSpace(tok); tok != "" {
				delete(h, http.CanonicalHeaderKey(tok))
			}
		}
	}
	trailers := keepTE && httpguts.HeaderValuesContainsToken(h["Te"], "trailers")
	for _, k := range hopHeaders {
		delete(h, k)
	}
	if trailers {
		h["Te"] = []string{"trailers"}
	}
}

// AppendHeaders writes h as header lines; a name that is not a valid field
// name is left out, CR and LF in a value become spaces.
func AppendHeaders(b []byte, h http.Header) []byte {
	for k, vs := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			start := len(b)
			b = append(b, v...)
			for i := start; i < len(b); i++ {
				if b[i] == '\r' || b[i] == '\n' {
					b[i] = ' '
				}
			}
			b = append(b, "\r\n"...)
		}
	}
	return b
}

// ChunkReserve is the room left before a chunk's data for its size line.
const ChunkReserve = 18 // 16 hex digits and CRLF

// FrameChunk frames the n data bytes at buf[pre+ChunkReserve:] as one
// chunk, moving the pre bytes before it (a head not yet written) to stay
// in front; it returns the framed bytes, ready for one write.
func FrameChunk(buf []byte, pre, n int) []byte {
	var hex [16]byte
	h := strconv.AppendUint(hex[:0], uint64(n), 16)
	at := pre + ChunkReserve - len(h) - 2
	copy(buf[at:], h)
	buf[pre+ChunkReserve-2], buf[pre+ChunkReserve-1] = '\r', '\n'
	end := pre + ChunkReserve + n
	buf[end], buf[end+1] = '\r', '\n'
	if pre > 0 {
		copy(buf[at-pre:at], buf[:pre])
	}
	return buf[at-pre : end+2]
}

// AppendLastChunk ends a chunked body: the zero chunk, the trailers, CRLF.
func AppendLastChunk(b []byte, trailer http.Header) []byte {
	b = append(b, "0\r\n"...)
	b = AppendHeaders(b, trailer)
	return append(b, "\r\n"...)
}

// AppendRequestHead writes the upstream request line, Host, header and
// framing: a held body's length, a streamed body's Content-Length or
// chunked, or for no body "Content-Length: 0" where net/http sends it.
func AppendRequestHead(b []byte, r *http.Request, held []byte, streamed, chunked bool) []byte {
	b = append(b, r.Method...)
	b = append(b, ' ')
	b = append(b, r.URL.RequestURI()...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, r.Host...)
	b = append(b, "\r\n"...)
	b = AppendHeaders(b, r.Header)
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

// IsEOF reports whether the body has nothing more (a Read of nothing returns EOF).
func IsEOF(r io.Reader) bool {
	var b [1]byte
	n, err := r.Read(b[:0])
	if n == 0 && err == nil {
		n, err = r.Read(b[:])
	}
	return n == 0 && err == io.EOF
}

// IsTimeout reports whether a deadline (the route's timeout or per-try timeout) ended it.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
