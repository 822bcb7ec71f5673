package hbone

import (
	"errors"
	"io"
	"net"
	"sync/atomic"

	"golang.org/x/net/http2"
)

const (
	// spliceStartBuf is the read buffer a busy direction starts with;
	// spliceMaxBuf is where it stops growing while reads keep filling it.
	spliceStartBuf = 16 << 10
	spliceMaxBuf   = 256 << 10
	// spliceIdleBuf is held by a blocked read on a connection that cannot
	// report readiness (not a socket, not a Tunnel).
	spliceIdleBuf = 1 << 10
)

// Splice copies bytes both ways between a tunnel and a connection until
// both directions have ended, passing half-close through: EOF from c
// half-closes t, and EOF from t half-closes c (when c has CloseWrite, as
// TCP connections and Tunnels do). An error in either direction aborts
// both: t is reset and c closed. Splice owns both and closes them before
// it returns; the result is nil when both directions ended with EOF.
//
// While a direction is idle it holds no buffer and the tunnel→c direction
// no goroutine: socket reads take their pooled buffer only once the socket
// is readable (pollReader), and received tunnel bytes are written to c
// straight from the receive chunks by a goroutine that runs only while
// there is something to write. A small frame for a TCP c whose socket has
// room is written by the connection's read loop itself, without that
// goroutine (see writeThrough). The c→tunnel direction runs on the calling
// goroutine; SpliceAsync needs none while c is idle.
func Splice(t *Tunnel, c net.Conn) error {
	var err error
	ended := make(chan struct{})
	s := newSplice(t, c, func(e error) { err = e; close(ended) })
	s.begin()
	s.endIn(copyToTunnel(t, c))
	<-ended
	return err
}

// SpliceAsync is Splice without a goroutine per idle tunnel: it returns at
// once and calls done, exactly once and on some other goroutine or before
// it returns, with the error Splice would have returned, after both
// directions ended and t and c were closed. For a TCP c on Linux the
// c→tunnel direction waits for readability in an epoll set of the
// package's own (see splicePoll) instead of a goroutine parked in a read,
// so an idle spliced tunnel holds no goroutine and no buffer; any other c
// gets a goroutine as with Splice.
//
// The splice owns t and c. To end it early close t (or, on the server,
// Request.Abort): that wakes both directions. Closing only c does not wake
// a socket the epoll set watches (the kernel drops a closed descriptor
// from it silently); such a splice is found by a sweep once a second.
func SpliceAsync(t *Tunnel, c net.Conn, done func(error)) {
	s := newSplice(t, c, done)
	s.w = newSockWatch(s)
	s.begin()
	if s.w != nil {
		s.w.start()
		return
	}
	go func() { s.endIn(copyToTunnel(t, c)) }()
}

// splice is one tunnel spliced with one connection: two directions, each
// ending once, and the completion after the second.
type splice struct {
	t    *Tunnel
	c    net.Conn
	done func(error)
	w    *sockWatch // nil: the c→t direction runs a blocking copy loop
	left atomic.Int32
	// inErr is how the c→t direction ended; written before its left.Add.
	inErr error
}

func newSplice(t *Tunnel, c net.Conn, done func(error)) *splice {
	s := &splice{t: t, c: c, done: done}
	s.left.Store(2)
	return s
}

// begin starts the t→c direction: received bytes go to c from now on.
func (s *splice) begin() {
	t := s.t
	t.c.mu.Lock()
	t.sink, t.through, t.splice = s.c, newSinkWriter(s.c), s
	t.c.mu.Unlock()
	t.spliced.Store(true)
	t.kickDrain() // bytes may have arrived before the splice began
}

// endIn ends the c→t direction with err from reading c (nil at EOF):
// half-close t at EOF; on an error reset t and close c, which ends the
// other direction too.
func (s *splice) endIn(err error) {
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if err == nil {
		err = s.t.CloseWrite()
	}
	if err != nil {
		s.t.resetWith(http2.ErrCodeCancel, true)
		s.c.Close()
	}
	s.inErr = err
	if s.left.Add(-1) == 0 {
		s.finish()
	}
}

// endOut ends the t→c direction (its error is t.drainErr).
func (s *splice) endOut() {
	if s.left.Add(-1) == 0 {
		s.finish()
	}
}

// abortIn ends the c→t direction from outside because the other one
// failed: close c, which ends a blocked read, and end a watched socket's
// registration, which closing it does not.
func (s *splice) abortIn() {
	if s.w != nil {
		s.w.abort()
		return
	}
	s.c.Close()
}

func (s *splice) finish() {
	t, c := s.t, s.c
	t.c.mu.Lock()
	err2 := t.drainErr
	t.c.mu.Unlock()
	c.Close()
	t.Close()
	err := s.inErr
	if err2 != nil && (err == nil || errors.Is(err, net.ErrClosed)) {
		// The tunnel direction failed first and closed c under the other
		// direction's read: its error is the cause (for example the
		// connection closed because its peer was revoked).
		err = err2
	}
	s.done(err)
}

// copyToTunnel copies c to t until EOF (nil) or an error.
func copyToTunnel(t *Tunnel, c net.Conn) error {
	if pr := newPollReader(c); pr != nil {
		size := spliceStartBuf
		for {
			bp, n, err := pr.read(size)
			if err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			_, werr := t.Write((*bp)[:n])
			full := n == len(*bp)
			putBuf(bp)
			if werr != nil {
				return werr
			}
			// A full read means more is queued: read bigger; a short one
			// means we caught up: go back to the small start size.
			switch {
			case full && size < spliceMaxBuf:
				size *= 4
			case !full:
				size = spliceStartBuf
			}
		}
	}
	peer, _ := c.(*Tunnel)
	initial := spliceIdleBuf
	if peer != nil {
		initial = spliceStartBuf
	}
	size := initial
	for {
		if peer != nil {
			if err := peer.waitReadable(t.c.ctx); err != nil {
				return err
			}
		}
		bp := getBuf(size)
		for {
			n, err := c.Read(*bp)
			if n > 0 {
				if _, werr := t.Write((*bp)[:n]); werr != nil {
					putBuf(bp)
					return werr
				}
			}
			if err != nil {
				putBuf(bp)
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			if n < len(*bp) {
				break // drained: give the buffer back and wait for more
			}
			if size < spliceMaxBuf {
				putBuf(bp)
				size *= 4
				bp = getBuf(size)
			}
		}
		putBuf(bp)
		size = initial
	}
}
