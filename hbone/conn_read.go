package hbone

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The read side of conn: readLoop, the connection's one goroutine, reads every
// frame and dispatches it by type. Control and header payloads are read into
// the scratch buffer c.rbuf; DATA goes to the stream's queue.

func (c *conn) readLoop() {
	err := c.readFrames()
	var ce connError
	if errors.As(err, &ce) {
		c.mu.Lock()
		last := c.lastPeerStream
		c.mu.Unlock()
		c.writeGoAway(last, ce.code, ce.reason)
	}
	c.fail(err)
}

func (c *conn) readFrames() error {
	if !c.client {
		var pre [len(clientPreface)]byte
		if _, err := io.ReadFull(c.nc, pre[:]); err != nil {
			return fmt.Errorf("read client preface: %w", err)
		}
		if string(pre[:]) != clientPreface {
			return protoErr("bad client preface %q", pre[:])
		}
	}
	for {
		if _, err := io.ReadFull(c.nc, c.hdr[:]); err != nil {
			return err
		}
		c.readActive.Store(true)
		h := c.hdr
		length := uint32(h[0])<<16 | uint32(h[1])<<8 | uint32(h[2])
		typ, flags := h[3], h[4]
		sid := binary.BigEndian.Uint32(h[5:]) & maxStreamID
		if length > c.cfg.MaxFrameSize {
			return connError{http2.ErrCodeFrameSize, fmt.Sprintf("frame of %d bytes exceeds %d", length, c.cfg.MaxFrameSize)}
		}
		if !c.sawFrame {
			// A GOAWAY first is a violation, but its reason is worth reading.
			if (typ != frameSettings || flags&flagAck != 0) && typ != frameGoAway {
				return protoErr("first frame is type %d, want SETTINGS", typ)
			}
			c.sawFrame = true
		}
		if c.cont.sid != 0 && (typ != frameContinuation || sid != c.cont.sid) {
			return protoErr("frame type %d inside a header block", typ)
		}
		var err error
		switch typ {
		case frameData:
			err = c.readData(length, flags, sid)
		case frameHeaders:
			err = c.readHeaders(length, flags, sid)
		case frameContinuation:
			err = c.readContinuation(length, flags, sid)
		case frameSettings:
			err = c.readSettings(length, flags, sid)
		case framePing:
			err = c.readPing(length, flags, sid)
		case frameWindowUpdate:
			err = c.readWindowUpdate(length, sid)
		case frameRSTStream:
			err = c.readRST(length, sid)
		case frameGoAway:
			err = c.readGoAway(length, sid)
		case framePriority:
			if sid == 0 || length != 5 {
				return protoErr("bad PRIORITY frame")
			}
			_, err = c.payload(length)
		case framePushPromise:
			return protoErr("PUSH_PROMISE is not allowed")
		default: // unknown frame types are ignored (RFC 9113 section 4.1)
			_, err = io.CopyN(io.Discard, c.nc, int64(length))
		}
		if err != nil {
			return err
		}
	}
}

// payload reads a whole frame payload into the read loop's scratch buffer.
// Only control and header frames use it; their size is bounded below.
func (c *conn) payload(n uint32) ([]byte, error) {
	if cap(c.rbuf) < int(n) {
		c.rbuf = make([]byte, n)
	}
	b := c.rbuf[:n]
	_, err := io.ReadFull(c.nc, b)
	return b, err
}

// releaseScratch drops a large scratch buffer so a connection that once
// saw a big header block does not pin it.
func (c *conn) releaseScratch() {
	if cap(c.rbuf) > scratchSize {
		c.rbuf = nil
	}
}

func (c *conn) readData(length uint32, flags uint8, sid uint32) error {
	if sid == 0 {
		return protoErr("DATA on stream 0")
	}
	rem := int(length)
	pad := 0
	if flags&flagPadded != 0 {
		if rem < 1 {
			return protoErr("padded DATA without pad length")
		}
		var pl [1]byte
		if _, err := io.ReadFull(c.nc, pl[:]); err != nil {
			return err
		}
		rem--
		pad = int(pl[0])
		if pad > rem {
			return protoErr("DATA padding exceeds payload")
		}
		rem -= pad
	}
	c.mu.Lock()
	if int64(length) > c.recvWin {
		c.mu.Unlock()
		return connError{http2.ErrCodeFlowControl, "peer exceeded the connection window"}
	}
	c.recvWin -= int64(length)
	t := c.streams[sid]
	var rstCode http2.ErrCode
	switch {
	case t == nil:
		if c.isIdleStreamLocked(sid) {
			c.mu.Unlock()
			return protoErr("DATA on idle stream %d", sid)
		}
	case t.remoteEnd:
		t, rstCode = nil, http2.ErrCodeStreamClosed
	case int64(length) > t.recvWin:
		t, rstCode = nil, http2.ErrCodeFlowControl
	default:
		t.recvWin -= int64(length)
		// Padding counts against the windows but is never read: return it now.
		t.recvUnacked += int64(length) - int64(rem)
	}
	c.mu.Unlock()
	if t == nil {
		if _, err := io.CopyN(io.Discard, c.nc, int64(rem)); err != nil {
			return err
		}
		c.creditConn(int64(length))
		if rstCode != 0 {
			c.resetStreamID(sid, rstCode)
		}
		return c.discardPad(pad)
	}
	if padding := int64(length) - int64(rem); padding > 0 {
		c.creditConn(padding)
	}
	// A frame of one chunk (request/response traffic) may be written to a
	// spliced socket right here; bulk frames keep the drain goroutine, so
	// decrypting the next frame overlaps writing this one.
	through := rem <= maxChunk
	for rem > 0 {
		k := min(rem, maxChunk)
		if err := c.readChunk(t, k, through); err != nil {
			return err
		}
		rem -= k
	}
	if err := c.discardPad(pad); err != nil {
		return err
	}
	if flags&flagEndStream != 0 {
		c.endRemote(t)
	}
	return nil
}

// scratchSize is the read loop's scratch buffer, held for the connection's
// life: DATA chunks smaller than it pass through it, and control and
// header frames are read into it (a larger one gets a buffer of its own
// that releaseScratch drops). 4 KiB, not a whole 16 KiB frame: larger
// chunks go to pooled buffers anyway, and every pooled HBONE connection,
// client and server side, holds one.
const scratchSize = 4 << 10

// readChunk reads the next k (at most maxChunk) bytes of a DATA payload and
// queues them on t. A chunk of 4 KiB or more is read straight into a pooled
// buffer that the queue then owns; a smaller one goes through the scratch
// buffer and is copied onto the queue's tail. If the stream went away while
// we read, the bytes are dropped and their window returned. With through,
// a spliced tunnel whose queue is empty gets the bytes written to its
// socket at once instead (see writeThrough).
func (c *conn) readChunk(t *Tunnel, k int, through bool) error {
	var bp *[]byte
	var b []byte
	if k >= scratchSize {
		bp = getBuf(k)
		b = *bp
	} else {
		if cap(c.rbuf) < scratchSize {
			c.rbuf = make([]byte, scratchSize)
		}
		b = c.rbuf[:k]
	}
	if _, err := io.ReadFull(c.nc, b); err != nil {
		if bp != nil {
			putBuf(bp)
		}
		return err
	}
	c.mu.Lock()
	if t.err != nil || t.closed {
		c.mu.Unlock()
		if bp != nil {
			putBuf(bp)
		}
		c.creditConn(int64(k))
		return nil
	}
	if through && t.through != nil && !t.draining && t.q.n == 0 && t.splice != nil {
		c.writeThrough(t, bp, b)
		return nil
	}
	if bp != nil {
		t.q.pushChunk(bp)
	} else {
		t.q.push(b)
	}
	c.mu.Unlock()
	t.wakeRead()
	return nil
}

// writeThrough writes b (held in bp when bp is not nil) to t's spliced
// socket from the read loop, without blocking, and queues for the drain
// goroutine whatever the socket did not take. This saves the hand-off to
// that goroutine (its start and the wake-up of another thread) and a copy
// for the common small write into a socket with room. The caller holds
// c.mu; it is released. draining marks the sink as being written, so no
// drain starts meanwhile and the bytes keep their order.
func (c *conn) writeThrough(t *Tunnel, bp *[]byte, b []byte) {
	t.draining = true
	w := t.through
	c.mu.Unlock()
	n := w.write(b)
	c.mu.Lock()
	t.draining = false
	var sInc, cInc, dropped int64
	switch {
	case n == len(b):
		if bp != nil {
			putBuf(bp)
		}
	case t.closed || t.err != nil:
		dropped = int64(len(b) - n) // Close reset the queue meanwhile
		if bp != nil {
			putBuf(bp)
		}
	case bp != nil:
		t.q.pushChunkFrom(bp, n)
	default:
		t.q.push(b[n:])
	}
	if n > 0 {
		sInc, cInc = t.consumedLocked(int64(n))
	}
	c.mu.Unlock()
	if n > 0 {
		t.recvd.Add(int64(n))
		c.writeWindowUpdates(t.id, sInc, cInc)
	}
	c.creditConn(dropped)
	// Bytes left over, or an end, error or Close that arrived while the
	// sink was ours: the drain goroutine takes it from here.
	t.kickDrain()
}

// endRemote records the peer's END_STREAM on t, removes the stream if this
// side has ended too, and wakes its reader.
func (c *conn) endRemote(t *Tunnel) {
	c.mu.Lock()
	t.remoteEnd = true
	gone := c.maybeRemoveLocked(t)
	c.mu.Unlock()
	t.wakeRead()
	c.afterRemove(gone)
}

func (c *conn) discardPad(pad int) error {
	if pad == 0 {
		return nil
	}
	_, err := io.CopyN(io.Discard, c.nc, int64(pad))
	return err
}

// lockedStream takes mu and returns sid's stream with mu still held. For a
// stream it does not track it releases mu and returns nil, with a protocol
// error if sid was never opened (a frame on an idle stream) and no error if
// the stream is gone already (closed or reset: the frame is ignored).
func (c *conn) lockedStream(sid uint32, frame string) (*Tunnel, error) {
	c.mu.Lock()
	if t := c.streams[sid]; t != nil {
		return t, nil
	}
	idle := c.isIdleStreamLocked(sid)
	c.mu.Unlock()
	if idle {
		return nil, protoErr("%s on idle stream %d", frame, sid)
	}
	return nil, nil
}

// isIdleStreamLocked reports whether sid was never opened (RFC 9113 5.1).
func (c *conn) isIdleStreamLocked(sid uint32) bool {
	if c.client {
		return sid%2 == 0 || sid >= c.nextID
	}
	return sid > c.lastPeerStream
}

func (c *conn) readHeaders(length uint32, flags uint8, sid uint32) error {
	if sid == 0 {
		return protoErr("HEADERS on stream 0")
	}
	if length > 2*c.maxHeaderList+64 {
		return connError{http2.ErrCodeEnhanceYourCalm, fmt.Sprintf("header block of %d bytes", length)}
	}
	p, err := c.payload(length)
	if err != nil {
		return err
	}
	if flags&flagPadded != 0 {
		if len(p) < 1 || int(p[0]) > len(p)-1 {
			return protoErr("bad HEADERS padding")
		}
		p = p[1 : len(p)-int(p[0])]
	}
	if flags&flagPriority != 0 {
		if len(p) < 5 {
			return protoErr("short HEADERS priority")
		}
		p = p[5:]
	}
	end := flags&flagEndStream != 0
	if flags&flagEndHeaders != 0 {
		return c.headerBlockDone(sid, end, p)
	}
	c.cont = headerBlock{sid: sid, endStream: end, buf: append(c.cont.buf[:0], p...)}
	return nil
}

func (c *conn) readContinuation(length uint32, flags uint8, sid uint32) error {
	if c.cont.sid == 0 || sid != c.cont.sid {
		return protoErr("unexpected CONTINUATION")
	}
	if uint32(len(c.cont.buf))+length > 2*c.maxHeaderList+64 {
		return connError{http2.ErrCodeEnhanceYourCalm, "header block too large"}
	}
	p, err := c.payload(length)
	if err != nil {
		return err
	}
	c.cont.buf = append(c.cont.buf, p...)
	if flags&flagEndHeaders == 0 {
		return nil
	}
	hb := c.cont
	c.cont.sid = 0
	err = c.headerBlockDone(hb.sid, hb.endStream, hb.buf)
	c.cont.buf = c.cont.buf[:0]
	if cap(c.cont.buf) > maxChunk {
		c.cont.buf = nil
	}
	return err
}

func (c *conn) emitField(f hpack.HeaderField) {
	c.fieldsSize += f.Size()
	if c.fieldsSize > c.maxHeaderList {
		c.fieldsBig = true
		return
	}
	c.fields = append(c.fields, f)
}

func (c *conn) headerBlockDone(sid uint32, endStream bool, block []byte) error {
	c.fields, c.fieldsSize, c.fieldsBig = c.fields[:0], 0, false
	if _, err := c.hdec.Write(block); err != nil {
		return connError{http2.ErrCodeCompression, err.Error()}
	}
	if err := c.hdec.Close(); err != nil {
		return connError{http2.ErrCodeCompression, err.Error()}
	}
	c.releaseScratch()
	if c.client {
		return c.onResponseHeaders(sid, endStream)
	}
	return c.onRequestHeaders(sid, endStream)
}

func (c *conn) onRequestHeaders(sid uint32, endStream bool) error {
	c.mu.Lock()
	if sid%2 == 0 {
		c.mu.Unlock()
		return protoErr("client opened even stream %d", sid)
	}
	if sid <= c.lastPeerStream {
		// Trailers on an open stream end it; anything else is an error.
		t := c.streams[sid]
		if t == nil {
			c.mu.Unlock()
			return connError{http2.ErrCodeStreamClosed, fmt.Sprintf("HEADERS on closed stream %d", sid)}
		}
		c.mu.Unlock()
		return c.trailers(t, endStream)
	}
	c.lastPeerStream = sid
	if c.closing || c.fieldsBig || c.active >= int(c.advMaxStreams) {
		limit := !c.closing && !c.fieldsBig
		c.mu.Unlock()
		code := http2.ErrCodeRefusedStream
		if c.fieldsBig {
			code = http2.ErrCodeProtocol
		}
		c.resetStreamID(sid, code)
		if limit {
			c.refused++
			if c.onRefused != nil {
				c.onRefused(c.refused)
			}
		}
		return nil
	}
	t := c.newTunnelLocked(sid)
	t.remoteEnd = endStream
	c.streams[sid] = t
	c.active++
	c.mu.Unlock()
	c.onStream(t, c.fields)
	return nil
}

func (c *conn) trailers(t *Tunnel, endStream bool) error {
	if !endStream {
		t.resetWith(http2.ErrCodeProtocol, false)
		return nil
	}
	c.endRemote(t)
	return nil
}

func (c *conn) onResponseHeaders(sid uint32, endStream bool) error {
	t, err := c.lockedStream(sid, "HEADERS")
	if t == nil {
		return err
	}
	if t.status != 0 {
		c.mu.Unlock()
		return c.trailers(t, endStream)
	}
	c.mu.Unlock()
	status := 0
	var baggage string
	for _, f := range c.fields {
		switch f.Name {
		case ":status":
			if n, err := strconv.Atoi(f.Value); err == nil && len(f.Value) == 3 && n >= 100 {
				status = n
			}
		case "baggage":
			baggage = f.Value
		}
	}
	if status == 0 || c.fieldsBig {
		t.resetWith(http2.ErrCodeProtocol, false)
		return nil
	}
	if status < 200 {
		if endStream {
			t.resetWith(http2.ErrCodeProtocol, false)
		}
		return nil // informational: wait for the final answer
	}
	c.mu.Lock()
	t.status, t.respBaggage = status, baggage
	t.remoteEnd = endStream
	gone := c.maybeRemoveLocked(t)
	c.mu.Unlock()
	t.wakeRead()
	c.afterRemove(gone)
	return nil
}

func (c *conn) readSettings(length uint32, flags uint8, sid uint32) error {
	if sid != 0 {
		return protoErr("SETTINGS on stream %d", sid)
	}
	if flags&flagAck != 0 {
		if length != 0 {
			return connError{http2.ErrCodeFrameSize, "SETTINGS ACK with payload"}
		}
		return nil
	}
	if length%6 != 0 || length > 6*64 {
		return connError{http2.ErrCodeFrameSize, "bad SETTINGS length"}
	}
	p, err := c.payload(length)
	if err != nil {
		return err
	}
	c.mu.Lock()
	var tableSize uint32
	tableSizeSet := false
	grew := false
	for ; len(p) > 0; p = p[6:] {
		id, v := http2.SettingID(binary.BigEndian.Uint16(p)), binary.BigEndian.Uint32(p[2:])
		switch id {
		case http2.SettingHeaderTableSize:
			tableSize, tableSizeSet = v, true
		case http2.SettingEnablePush:
			if v > 1 || (v == 1 && !c.client) {
				c.mu.Unlock()
				return protoErr("bad ENABLE_PUSH %d", v)
			}
		case http2.SettingMaxConcurrentStreams:
			c.peerMaxStreams = v
		case http2.SettingInitialWindowSize:
			if v > maxWindow {
				c.mu.Unlock()
				return connError{http2.ErrCodeFlowControl, "INITIAL_WINDOW_SIZE too large"}
			}
			delta := int64(v) - c.peerInitWindow
			c.peerInitWindow = int64(v)
			for _, t := range c.streams {
				t.sendWin += delta
				if t.sendWin > maxWindow {
					c.mu.Unlock()
					return connError{http2.ErrCodeFlowControl, "stream window overflow"}
				}
			}
			grew = grew || delta > 0
		case http2.SettingMaxFrameSize:
			if v < minFrameSize || v > maxFrameSizeHi {
				c.mu.Unlock()
				return protoErr("bad MAX_FRAME_SIZE %d", v)
			}
			c.peerMaxFrame = v
		}
	}
	select {
	case <-c.ready:
	default:
		close(c.ready)
	}
	var wake []*Tunnel
	if grew {
		for _, t := range c.streams {
			wake = append(wake, t)
		}
	}
	c.mu.Unlock()
	for _, t := range wake {
		t.wakeWrite()
	}
	c.wmu.Lock()
	if tableSizeSet {
		c.henc.SetMaxDynamicTableSizeLimit(min(tableSize, 4096))
	}
	err = c.writeFrameLocked(frameSettings, flagAck, 0, nil)
	c.wmu.Unlock()
	return err
}

func (c *conn) readPing(length uint32, flags uint8, sid uint32) error {
	if sid != 0 || length != 8 {
		return connError{http2.ErrCodeFrameSize, "bad PING"}
	}
	p, err := c.payload(8)
	if err != nil {
		return err
	}
	if flags&flagAck != 0 {
		c.mu.Lock()
		if c.pingOut && binary.BigEndian.Uint64(p) == c.pingSeq {
			c.pingOut = false
		}
		c.mu.Unlock()
		return nil
	}
	return c.writeFrame(framePing, flagAck, 0, p)
}

func (c *conn) readWindowUpdate(length uint32, sid uint32) error {
	if length != 4 {
		return connError{http2.ErrCodeFrameSize, "bad WINDOW_UPDATE length"}
	}
	p, err := c.payload(4)
	if err != nil {
		return err
	}
	inc := int64(binary.BigEndian.Uint32(p) & maxStreamID)
	if sid == 0 {
		if inc == 0 {
			return protoErr("connection WINDOW_UPDATE of 0")
		}
		c.mu.Lock()
		c.sendWin += inc
		if c.sendWin > maxWindow {
			c.mu.Unlock()
			return connError{http2.ErrCodeFlowControl, "connection window overflow"}
		}
		close(c.sendWinCh)
		c.sendWinCh = make(chan struct{})
		c.mu.Unlock()
		return nil
	}
	t, err := c.lockedStream(sid, "WINDOW_UPDATE")
	if t == nil {
		return err
	}
	if inc == 0 || t.sendWin+inc > maxWindow {
		c.mu.Unlock()
		code := http2.ErrCodeProtocol
		if inc != 0 {
			code = http2.ErrCodeFlowControl
		}
		t.resetWith(code, false)
		return nil
	}
	t.sendWin += inc
	c.mu.Unlock()
	t.wakeWrite()
	return nil
}

func (c *conn) readRST(length uint32, sid uint32) error {
	if sid == 0 || length != 4 {
		return protoErr("bad RST_STREAM")
	}
	p, err := c.payload(4)
	if err != nil {
		return err
	}
	code := http2.ErrCode(binary.BigEndian.Uint32(p))
	t, err := c.lockedStream(sid, "RST_STREAM")
	if t == nil {
		return err
	}
	var e error = &StreamResetError{Code: code, Remote: true}
	if code == http2.ErrCodeRefusedStream && c.client && t.status == 0 {
		e = fmt.Errorf("%w: %w", e, errRetry)
	}
	t.err = e
	gone := c.removeLocked(t)
	cancel := t.cancel
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	t.wakeRead()
	t.wakeWrite()
	c.afterRemove(gone)
	return nil
}

func (c *conn) readGoAway(length uint32, sid uint32) error {
	if sid != 0 || length < 8 {
		return protoErr("bad GOAWAY")
	}
	// Keep the first KiB of debug data and skip the rest, so a peer cannot
	// make the scratch buffer grow to its frame size with a GOAWAY.
	const maxDebug = 1024
	p, err := c.payload(min(length, 8+maxDebug))
	if err != nil {
		return err
	}
	if length > 8+maxDebug {
		if _, err := io.CopyN(io.Discard, c.nc, int64(length)-8-maxDebug); err != nil {
			return err
		}
	}
	last := binary.BigEndian.Uint32(p) & maxStreamID
	code := http2.ErrCode(binary.BigEndian.Uint32(p[4:]))
	c.mu.Lock()
	c.closing = true
	var failed []*Tunnel
	if c.client {
		for id, t := range c.streams {
			if id > last && t.err == nil {
				t.err = fmt.Errorf("hbone: GOAWAY (%s) above stream %d: %w", code, last, errRetry)
				failed = append(failed, t)
			}
		}
	}
	for _, t := range failed {
		c.removeLocked(t) // idleness is checked below, with the GOAWAY in mind
	}
	idle := c.active == 0
	c.mu.Unlock()
	for _, t := range failed {
		t.wakeRead()
		t.wakeWrite()
	}
	if idle {
		if code == http2.ErrCodeNo {
			return io.EOF
		}
		return fmt.Errorf("peer sent GOAWAY %s: %q", code, p[8:])
	}
	return nil
}
