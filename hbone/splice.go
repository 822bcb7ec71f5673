package hbone

import (
	"errors"
	"io"
	"net"

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
// goroutine (see writeThrough).
func Splice(t *Tunnel, c net.Conn) error {
	done := make(chan struct{})
	t.c.mu.Lock()
	t.sink, t.through, t.drainDone = c, newSinkWriter(c), done
	t.c.mu.Unlock()
	t.spliced.Store(true)
	t.kickDrain() // bytes may have arrived before the splice began

	err := copyToTunnel(t, c)
	if err == nil {
		err = t.CloseWrite()
	}
	if err != nil {
		t.resetWith(http2.ErrCodeCancel, true)
		c.Close()
	}
	<-done
	t.c.mu.Lock()
	err2 := t.drainErr
	t.c.mu.Unlock()
	c.Close()
	t.Close()
	if err2 != nil && (err == nil || errors.Is(err, net.ErrClosed)) {
		// The tunnel direction failed first and closed c under the other
		// direction's read: its error is the cause (for example the
		// connection closed because its peer was revoked).
		err = err2
	}
	return err
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
