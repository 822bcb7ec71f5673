// Package upstream is the waypoint fast path's upstream HTTP/1.1
// connections: one request at a time on each; a downstream connection
// keeps the ones it used (Held) for its next request, and gives them to the
// shared idle Pool when it closes, where another downstream connection to
// the same endpoint takes them. The pool's lock is taken only then and on
// a miss, not per request.
package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/wire"
)

const (
	upIdleMax     = 64               // idle connections kept per endpoint, as the Transport's MaxIdleConnsPerHost
	upIdleTimeout = 90 * time.Second // an idle connection older than this is closed
	heldMax       = 4                // endpoints a downstream connection keeps a connection to
)

// Conn is one upstream connection.
type Conn struct {
	nc     net.Conn
	br     *bufio.Reader
	target netip.AddrPort
	since  time.Time     // idle since (kept or in the pool)
	reused bool          // it served a request before this one
	uses   int           // requests it carried
	last   bool          // maxRequestsPerConnection reached: closed after this one
	idle   time.Duration // idle timeout (0: upIdleTimeout)
}

// Limits are a DestinationRule connectionPool's settings for the
// connection a request uses; zero values are the defaults.
type Limits struct {
	// ConnectTimeout bounds dialling a new connection.
	ConnectTimeout time.Duration
	// MaxUses closes a connection after that many requests
	// (maxRequestsPerConnection).
	MaxUses int
	// IdleTimeout closes a connection idle that long (idleTimeout).
	IdleTimeout time.Duration
}

// fresh reports whether the idle connection may still be used.
func (uc *Conn) fresh() bool {
	d := uc.idle
	if d == 0 {
		d = upIdleTimeout
	}
	return time.Since(uc.since) < d
}

// Pool is the idle connections per endpoint. The zero Pool is empty and
// ready.
type Pool struct {
	mu     sync.Mutex
	idle   map[netip.AddrPort][]*Conn
	closed bool
}

// get takes the newest idle connection to target (nil: none).
func (p *Pool) get(target netip.AddrPort) *Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.idle[target]
	for len(l) > 0 {
		uc := l[len(l)-1]
		l[len(l)-1] = nil
		l = l[:len(l)-1]
		if uc.fresh() {
			p.idle[target] = l
			return uc
		}
		uc.nc.Close()
	}
	delete(p.idle, target)
	return nil
}

// Put keeps an idle connection, or closes it when the pool is full or closed.
func (p *Pool) Put(uc *Conn) {
	uc.since = time.Now()
	p.mu.Lock()
	if p.closed || len(p.idle[uc.target]) >= upIdleMax {
		p.mu.Unlock()
		uc.nc.Close()
		return
	}
	if p.idle == nil {
		p.idle = map[netip.AddrPort][]*Conn{}
	}
	p.idle[uc.target] = append(p.idle[uc.target], uc)
	p.mu.Unlock()
}

// Reap closes the connections idle longer than upIdleTimeout.
func (p *Pool) Reap() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for t, l := range p.idle {
		keep := l[:0]
		for _, uc := range l {
			if uc.fresh() {
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

// Close closes every idle connection; later puts close theirs.
func (p *Pool) Close() {
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

// ReapUntil closes the connections idle longer than upIdleTimeout as they
// age, until done closes; then it closes the pool.
func (p *Pool) ReapUntil(done <-chan struct{}) {
	t := time.NewTicker(upIdleTimeout / 3)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			p.Reap()
		case <-done:
			p.Close()
			return
		}
	}
}

// IdleCount is how many idle connections the pool holds.
func (p *Pool) IdleCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.idle {
		n += len(l)
	}
	return n
}

// DialFunc opens a connection to an endpoint the routing step chose.
type DialFunc func(ctx context.Context, target netip.AddrPort, forwarded string) (net.Conn, error)

// Held is the upstream connections one downstream connection keeps between
// its requests (at most heldMax endpoints); Close gives them to the pool.
type Held struct {
	pool *Pool
	dial DialFunc
	m    map[netip.AddrPort]*Conn
}

// NewHeld returns the empty set of a new downstream connection: new
// connections are dialled with dial, idle ones come from and go to pool.
func NewHeld(pool *Pool, dial DialFunc) *Held { return &Held{pool: pool, dial: dial} }

// Close gives the held connections to the pool.
func (h *Held) Close() {
	for _, uc := range h.m {
		h.pool.Put(uc)
	}
	h.m = nil
}

// upstream returns a connection to target: the one this downstream
// connection kept, an idle one from the pool, or a new one (fresh: always
// new).
func (h *Held) upstream(target netip.AddrPort, fresh bool, deadline time.Time, lim Limits) (*Conn, error) {
	if !fresh {
		if uc := h.m[target]; uc != nil {
			delete(h.m, target)
			if uc.fresh() {
				uc.reused = true
				return uc, nil
			}
			uc.nc.Close() // idle too long, as in the pool
		}
		if uc := h.pool.get(target); uc != nil {
			uc.reused = true
			return uc, nil
		}
	}
	ctx := context.Background()
	if lim.ConnectTimeout > 0 {
		if ct := time.Now().Add(lim.ConnectTimeout); deadline.IsZero() || ct.Before(deadline) {
			deadline = ct
		}
	}
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	nc, err := h.dial(ctx, target, "")
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	return &Conn{nc: nc, br: bufio.NewReaderSize(nc, 4<<10), target: target}, nil
}

// release keeps a connection whose exchange ended cleanly for this
// downstream connection's next request.
func (h *Held) release(uc *Conn) {
	uc.since = time.Now()
	if h.m == nil {
		h.m = make(map[netip.AddrPort]*Conn, 1)
	}
	if len(h.m) >= heldMax {
		h.pool.Put(uc)
		return
	}
	h.m[uc.target] = uc
}

// errBodyRead: the request body could not be read from the client (cut
// short, a bad chunk).
var errBodyRead = errors.New("reading the request body")

// copyBody sends a request body upstream (src: what is left of it after
// held bytes, if any), chunked when its length is unknown; it is the
// writer goroutine of a streamed request body. An error reading src wraps
// errBodyRead.
func copyBody(dst io.Writer, src io.Reader, chunked bool) error {
	buf := wire.Bufs.Get()
	defer wire.Bufs.Put(buf)
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
		n, err := src.Read(buf[wire.ChunkReserve : len(buf)-2])
		if n > 0 {
			if _, werr := dst.Write(wire.FrameChunk(buf, 0, n)); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			_, werr := dst.Write(wire.AppendLastChunk(buf[:0], nil))
			return werr
		}
		if err != nil {
			return fmt.Errorf("%w: %w", errBodyRead, err)
		}
	}
}
