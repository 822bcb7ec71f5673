package hbone

import (
	"time"
)

// Stream bookkeeping of conn (the stream map, the slot count, idle expiry)
// and connection-level receive flow control.

func (c *conn) newTunnelLocked(sid uint32) *Tunnel {
	return &Tunnel{
		c:       c,
		id:      sid,
		sendWin: c.peerInitWindow,
		recvWin: int64(c.cfg.StreamWindow),
		rnotify: make(chan struct{}, 1),
		wnotify: make(chan struct{}, 1),
	}
}

// maybeRemoveLocked removes t once both directions have ended. It reports
// whether the connection became idle (client side).
func (c *conn) maybeRemoveLocked(t *Tunnel) bool {
	if t.localEnd && t.remoteEnd {
		return c.removeLocked(t)
	}
	return false
}

func (c *conn) removeLocked(t *Tunnel) bool {
	if c.streams[t.id] != t {
		return false
	}
	delete(c.streams, t.id)
	if c.client && t.counted {
		t.counted = false
		c.active--
		return c.active == 0
	}
	return false
}

// afterRemove runs, without locks, what a stream's removal implies.
func (c *conn) afterRemove(idle bool) {
	if !idle {
		return
	}
	c.mu.Lock()
	closeNow := (c.closing || c.singleUse) && c.active == 0 && !c.closed
	c.mu.Unlock()
	if closeNow {
		c.closeGracefully()
		return
	}
	c.armIdle()
}

// armIdle starts the idle-expiry clock of a client connection that has no
// streams. One timer per connection is re-armed lazily: a stream that comes
// and goes in between only moves idleSince.
func (c *conn) armIdle() {
	if c.idleTimeout <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active != 0 || c.closed {
		return
	}
	c.idleSince = time.Now()
	if c.idleArmed {
		return
	}
	c.idleArmed = true
	if c.idleTimer == nil {
		c.idleTimer = time.AfterFunc(c.idleTimeout, c.idleCheck)
	} else {
		c.idleTimer.Reset(c.idleTimeout)
	}
}

func (c *conn) idleCheck() {
	c.mu.Lock()
	c.idleArmed = false
	if c.closed || c.active != 0 {
		c.mu.Unlock()
		return
	}
	if left := c.idleTimeout - time.Since(c.idleSince); left > 0 {
		c.idleArmed = true
		c.idleTimer.Reset(left)
		c.mu.Unlock()
		return
	}
	c.closing = true // from here on reserve fails: no stream can race the close
	c.mu.Unlock()
	c.closeGracefully()
}

// releaseSlot ends a server handler's hold on the stream limit.
func (c *conn) releaseSlot() {
	c.mu.Lock()
	c.active--
	closeNow := c.closing && c.active == 0 && !c.closed
	c.mu.Unlock()
	if closeNow {
		c.closeGracefully()
	}
}

// reserve takes a stream slot on a client connection if it can carry one
// more stream under limit (and the peer's MAX_CONCURRENT_STREAMS).
func (c *conn) reserve(limit int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.closed || c.nextID > maxStreamID || c.active >= limit || c.active >= int(c.peerMaxStreams) {
		return false
	}
	c.active++
	return true
}

// load reports the number of active streams and whether the connection
// takes new streams.
func (c *conn) load() (active int, usable bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.active, !c.closing && !c.closed && c.nextID <= maxStreamID
}

func (c *conn) unreserve() {
	c.mu.Lock()
	c.active--
	idle := c.active == 0
	c.mu.Unlock()
	c.afterRemove(idle)
}

// ---- flow control ----

// creditConn returns n consumed (or discarded) bytes to the connection
// window, sending a WINDOW_UPDATE once a quarter of it is owed.
func (c *conn) creditConn(n int64) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	c.recvUnacked += n
	inc := c.takeConnCreditLocked()
	c.mu.Unlock()
	if inc > 0 {
		c.writeWindowUpdates(0, 0, inc)
	}
}

func (c *conn) takeConnCreditLocked() int64 {
	if c.recvUnacked < int64(c.cfg.ConnWindow)/4 || c.closed {
		return 0
	}
	inc := c.recvUnacked
	c.recvUnacked = 0
	c.recvWin += inc
	return inc
}
