package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// Copy buffers start small so an idle or chatty connection pins little
// memory, and grow when a direction moves bulk data.
const (
	smallBuf = 16 << 10
	largeBuf = 256 << 10
)

var (
	smallPool = sync.Pool{New: func() any { b := make([]byte, smallBuf); return &b }}
	largePool = sync.Pool{New: func() any { b := make([]byte, largeBuf); return &b }}
)

// Counters are a connection's byte counts, safe to read while it runs.
type Counters struct {
	// Sent is bytes from the downstream (the accepting side) to upstream.
	Sent atomic.Int64
	// Received is bytes from upstream to downstream.
	Received atomic.Int64
	// probe estimates both totals while a copy that updates Sent and
	// Received only when it ends (a kernel splice, a tunnel owned by the
	// HBONE server) runs; nil when none.
	probe atomic.Pointer[func() (sent, recv int64)]
}

// SetProbe installs an estimate of the totals so far for copies that count
// only at their end (see Live).
func (c *Counters) SetProbe(f func() (sent, recv int64)) { c.probe.Store(&f) }

// Live returns the byte counts so far: Sent and Received, or the probe's
// estimate where it is ahead.
func (c *Counters) Live() (sent, recv int64) {
	sent, recv = c.Sent.Load(), c.Received.Load()
	if p := c.probe.Load(); p != nil {
		ps, pr := (*p)()
		sent, recv = max(sent, ps), max(recv, pr)
	}
	return sent, recv
}

// Bidirectional copies down→up and up→down until both directions end. When
// one side reaches EOF the other side's write half is closed (CloseWrite), so
// half-close passes through; the call returns when both directions are done,
// or both connections are closed when force ends (nil: never). Between two
// TCP sockets the kernel splices (no user-space copy). The first error other
// than a normal close is returned.
func Bidirectional(down, up net.Conn, c *Counters, force context.Context) error {
	if dt, ok := down.(*net.TCPConn); ok {
		if ut, ok := up.(*net.TCPConn); ok {
			// Spliced both ways: the sockets' own counts of what was read
			// from each tell the progress.
			c.SetProbe(func() (int64, int64) { return tcpConsumed(dt), tcpConsumed(ut) })
		}
	}
	errc := make(chan error, 1)
	go func() {
		errc <- copyHalf(up, down, &c.Sent)
	}()
	// A callback, not a watcher goroutine: nothing to start (and no thread
	// to wake) per connection.
	var forced atomic.Bool
	stop := func() bool { return false }
	if force != nil {
		stop = context.AfterFunc(force, func() {
			forced.Store(true)
			down.Close()
			up.Close()
		})
	}
	err1 := copyHalf(down, up, &c.Received)
	err2 := <-errc
	if !stop() && forced.Load() {
		return ErrForced
	}
	if err1 != nil {
		return err1
	}
	return err2
}

// ErrForced reports a connection closed by a drain deadline or a policy
// change rather than by its peers.
var ErrForced = errors.New("connection closed by the proxy (drain deadline or policy change)")

func copyHalf(dst, src net.Conn, n *atomic.Int64) error {
	if dt, ok := dst.(*net.TCPConn); ok {
		if st, ok := src.(*net.TCPConn); ok {
			// splice(2) through the kernel; the count lands when the
			// direction ends.
			w, err := dt.ReadFrom(st)
			n.Add(w)
			closeWrite(dst)
			return normalClose(err)
		}
	}
	err := bufferedCopy(dst, src, n)
	closeWrite(dst)
	return normalClose(err)
}

func bufferedCopy(dst, src net.Conn, n *atomic.Int64) error {
	bp := smallPool.Get().(*[]byte)
	pool := &smallPool
	bp, pool, err := copyLoop(dst, src, n, bp, pool)
	pool.Put(bp)
	return err
}

// copyLoop copies until EOF or error; it may swap the small buffer for a
// large one and returns whichever buffer (and its pool) it ended with.
func copyLoop(dst, src net.Conn, n *atomic.Int64, bp *[]byte, pool *sync.Pool) (*[]byte, *sync.Pool, error) {
	buf := *bp
	full := 0
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n.Add(int64(nw))
			if werr != nil {
				return bp, pool, werr
			}
			if nw != nr {
				return bp, pool, io.ErrShortWrite
			}
			// Grow to the large buffer after a few full reads: bulk traffic.
			if nr == len(buf) && pool == &smallPool {
				if full++; full >= 4 {
					smallPool.Put(bp)
					bp, pool = largePool.Get().(*[]byte), &largePool
					buf = *bp
				}
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				return bp, pool, nil
			}
			return bp, pool, rerr
		}
	}
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
}

func normalClose(err error) error {
	switch {
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ENOTCONN), errors.Is(err, os.ErrDeadlineExceeded):
		return nil
	}
	return err
}
