package waypoint

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Upstream HTTP/1.1 connections of the fast path (h1.go): one request at a
// time on each; a downstream connection keeps the ones it used (h1Conn.held)
// for its next request, and gives them to the shared idle pool when it
// closes, where another downstream connection to the same endpoint takes
// them (the pool's lock is taken only then and on a miss, not per request).

const (
	upIdleMax     = 64               // idle connections kept per endpoint, as the Transport's MaxIdleConnsPerHost
	upIdleTimeout = 90 * time.Second // an idle connection older than this is closed
	heldMax       = 4                // endpoints a downstream connection keeps a connection to
)

// upConn is one upstream connection.
type upConn struct {
	nc     net.Conn
	br     *bufio.Reader
	target netip.AddrPort
	since  time.Time // idle since (kept or in the pool)
	reused bool      // it served a request before this one
}

// upstreamPool is the idle connections per endpoint.
type upstreamPool struct {
	mu     sync.Mutex
	idle   map[netip.AddrPort][]*upConn
	closed bool
}

// get takes the newest idle connection to target (nil: none).
func (p *upstreamPool) get(target netip.AddrPort) *upConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.idle[target]
	for len(l) > 0 {
		uc := l[len(l)-1]
		l[len(l)-1] = nil
		l = l[:len(l)-1]
		if time.Since(uc.since) < upIdleTimeout {
			p.idle[target] = l
			return uc
		}
		uc.nc.Close()
	}
	delete(p.idle, target)
	return nil
}

// put keeps an idle connection, or closes it when the pool is full or closed.
func (p *upstreamPool) put(uc *upConn) {
	uc.since = time.Now()
	p.mu.Lock()
	if p.closed || len(p.idle[uc.target]) >= upIdleMax {
		p.mu.Unlock()
		uc.nc.Close()
		return
	}
	if p.idle == nil {
		p.idle = map[netip.AddrPort][]*upConn{}
	}
	p.idle[uc.target] = append(p.idle[uc.target], uc)
	p.mu.Unlock()
}

// reap closes the connections idle longer than upIdleTimeout.
func (p *upstreamPool) reap() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for t, l := range p.idle {
		keep := l[:0]
		for _, uc := range l {
			if time.Since(uc.since) < upIdleTimeout {
				keep = append(keep, uc)
			} else {
				uc.nc.Close()
			}
		}
		clear(l[len(keep):])
		if len(keep) == 0 {
			delete(p.idle, t)
		} else {
			p.idle[t] = keep
		}
	}
}

// close closes every idle connection; later puts close theirs.
func (p *upstreamPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, l := range p.idle {
		for _, uc := range l {
			uc.nc.Close()
		}
	}
	p.idle = nil
}

// reapUpstreams runs reap until the HTTP listener closes.
func (w *Waypoint) reapUpstreams() {
	t := time.NewTicker(upIdleTimeout / 3)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			w.upstreams.reap()
		case <-w.httpLn.closed:
			w.upstreams.close()
			return
		}
	}
}

// upstream returns a connection to target: the one this downstream
// connection kept, an idle one from the pool, or a new one (fresh: always
// new).
func (c *h1Conn) upstream(target netip.AddrPort, fresh bool, deadline time.Time) (*upConn, error) {
	if !fresh {
		if uc := c.held[target]; uc != nil {
			delete(c.held, target)
			if time.Since(uc.since) < upIdleTimeout {
				uc.reused = true
				return uc, nil
			}
			uc.nc.Close() // idle too long, as in the pool
		}
		if uc := c.w.upstreams.get(target); uc != nil {
			uc.reused = true
			return uc, nil
		}
	}
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	dial := c.w.dial
	if c.w.upstreamDial != nil {
		dial = c.w.upstreamDial
	}
	nc, err := dial(ctx, target, "")
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	return &upConn{nc: nc, br: bufio.NewReaderSize(nc, 4<<10), target: target}, nil
}

// release keeps a connection whose exchange ended cleanly for this
// downstream connection's next request.
func (c *h1Conn) release(uc *upConn) {
	uc.since = time.Now()
	if c.held == nil {
		c.held = make(map[netip.AddrPort]*upConn, 1)
	}
	if len(c.held) >= heldMax {
		c.w.upstreams.put(uc)
		return
	}
	c.held[uc.target] = uc
}

// isTimeout: a deadline (the route's timeout or per-try timeout) ended it.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// hopHeaders are the hop-by-hop fields (RFC 9110 §7.6.1), with the
// Proxy-* ones and Transfer-Encoding (framing is each hop's own).
var hopHeaders = [...]string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// removeHopByHop deletes the hop-by-hop fields and those the Connection
// field names; keepTE keeps "TE: trailers" (a request's, as ReverseProxy).
func removeHopByHop(h http.Header, keepTE bool) {
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

// appendHeaders writes h as header lines; a name that is not a valid field
// name is left out, CR and LF in a value become spaces.
func appendHeaders(b []byte, h http.Header) []byte {
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

// chunkReserve is the room left before a chunk's data for its size line.
const chunkReserve = 18 // 16 hex digits and CRLF

// frameChunk frames the n data bytes at buf[pre+chunkReserve:] as one
// chunk, moving the pre bytes before it (a head not yet written) to stay
// in front; it returns the framed bytes, ready for one write.
func frameChunk(buf []byte, pre, n int) []byte {
	var hex [16]byte
	h := strconv.AppendUint(hex[:0], uint64(n), 16)
	at := pre + chunkReserve - len(h) - 2
	copy(buf[at:], h)
	buf[pre+chunkReserve-2], buf[pre+chunkReserve-1] = '\r', '\n'
	end := pre + chunkReserve + n
	buf[end], buf[end+1] = '\r', '\n'
	if pre > 0 {
		copy(buf[at-pre:at], buf[:pre])
	}
	return buf[at-pre : end+2]
}

// appendLastChunk ends a chunked body: the zero chunk, the trailers, CRLF.
func appendLastChunk(b []byte, trailer http.Header) []byte {
	b = append(b, "0\r\n"...)
	b = appendHeaders(b, trailer)
	return append(b, "\r\n"...)
}

// errBodyRead: the request body could not be read from the client (cut
// short, a bad chunk).
var errBodyRead = errors.New("reading the request body")

// copyBody sends a request body upstream (src: what is left of it after
// held bytes, if any), chunked when its length is unknown; it is the
// writer goroutine of a streamed request body. An error reading src wraps
// errBodyRead.
func copyBody(dst io.Writer, src io.Reader, chunked bool) error {
	buf := h1Bufs.Get()
	defer h1Bufs.Put(buf)
	if !chunked {
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return werr
				}
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return fmt.Errorf("%w: %w", errBodyRead, err)
			}
		}
	}
	for {
		n, err := src.Read(buf[chunkReserve : len(buf)-2])
		if n > 0 {
			if _, werr := dst.Write(frameChunk(buf, 0, n)); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			_, werr := dst.Write(appendLastChunk(buf[:0], nil))
			return werr
		}
		if err != nil {
			return fmt.Errorf("%w: %w", errBodyRead, err)
		}
	}
}

// h1Bufs lends the fast path its 32 KiB head and body buffers.
var h1Bufs copyBuffers
