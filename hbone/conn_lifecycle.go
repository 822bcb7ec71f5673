package hbone

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/net/http2"
)

// The lifecycle of conn: graceful close (GOAWAY), failure, and the keepalive
// PING.

// goAway starts a graceful close: GOAWAY with the last stream this side
// processed, no new streams; the connection closes once its streams end.
func (c *conn) goAway() {
	c.mu.Lock()
	if c.sentGoAway || c.closed {
		c.mu.Unlock()
		return
	}
	c.sentGoAway, c.closing = true, true
	last := c.lastPeerStream
	idle := c.active == 0
	c.mu.Unlock()
	var p [8]byte
	binary.BigEndian.PutUint32(p[:], last)
	c.writeFrame(frameGoAway, 0, 0, p[:])
	if idle {
		c.closeGracefully()
	}
}

// closeGracefully sends GOAWAY(NO_ERROR) if not sent yet and closes.
func (c *conn) closeGracefully() {
	c.mu.Lock()
	sent := c.sentGoAway || c.closed
	c.sentGoAway = true
	last := c.lastPeerStream
	c.mu.Unlock()
	if !sent {
		c.writeGoAway(last, http2.ErrCodeNo, "")
	}
	c.fail(nil)
}

// fail ends the connection: every stream still open gets err, the socket is
// closed and the hooks run. It is idempotent.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		err = nil // the peer or we closed: a clean end
	}
	c.closed, c.closing, c.closeErr = true, true, err
	streamErr := c.streamErrLocked()
	var wake []*Tunnel
	for id, t := range c.streams {
		if t.err == nil {
			t.err = streamErr
		}
		if t.cancel != nil {
			t.cancel()
		}
		delete(c.streams, id)
		wake = append(wake, t)
	}
	close(c.done)
	close(c.sendWinCh)
	c.sendWinCh = make(chan struct{})
	if c.ka != nil {
		c.ka.Stop()
	}
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	c.mu.Unlock()
	if err != nil {
		// Broken or hostile peer: do not let TLS's close_notify wait on it.
		if c.raw != nil {
			c.raw.Close()
		} else if c.over != nil {
			c.over.Close()
		}
	}
	c.nc.Close()
	c.cancel()
	for _, t := range wake {
		t.wakeRead()
		t.wakeWrite()
	}
	if c.onClose != nil {
		c.onClose(err)
	}
}

// closedErrLocked says why the connection ended, as a cause to wrap:
// ErrConnClosed, with the error that closed it when there was one.
func (c *conn) closedErrLocked() error {
	if c.closeErr == nil {
		return ErrConnClosed
	}
	return fmt.Errorf("%w: %w", ErrConnClosed, classifyConnErr(c.closeErr))
}

func (c *conn) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closedErrLocked()
}

// streamErrLocked is the error a stream returns once the connection ended.
func (c *conn) streamErrLocked() error {
	return fmt.Errorf("hbone: %w", c.closedErrLocked())
}

func (c *conn) streamErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streamErrLocked()
}

func (c *conn) keepalive() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	active := c.readActive.Swap(false)
	now := time.Now()
	if c.pingOut {
		if since := now.Sub(c.pingSent); since >= c.cfg.KeepaliveTimeout && !active {
			c.mu.Unlock()
			c.fail(fmt.Errorf("keepalive PING not answered within %s", c.cfg.KeepaliveTimeout))
			return
		} else if active {
			c.pingOut = false
		} else {
			c.ka.Reset(c.cfg.KeepaliveTimeout - since)
			c.mu.Unlock()
			return
		}
	}
	if active {
		c.ka.Reset(c.cfg.KeepaliveInterval)
		c.mu.Unlock()
		return
	}
	c.pingOut, c.pingSent = true, now
	c.pingSeq++
	seq := c.pingSeq
	// Re-arm before writing: a write stuck behind a peer that stopped
	// reading must not stop the timeout from firing.
	c.ka.Reset(c.cfg.KeepaliveTimeout)
	c.mu.Unlock()
	var p [8]byte
	binary.BigEndian.PutUint64(p[:], seq)
	c.writeFrame(framePing, 0, 0, p[:])
}
