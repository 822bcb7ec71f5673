package hbone

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// conn is one HTTP/2 connection over an established TLS connection, client
// or server side. It carries CONNECT streams only, so it is much smaller
// than a general HTTP/2 stack: no server push, no priorities, no request
// bodies other than the tunnel bytes.
//
// Goroutines: one read loop per connection; nothing per stream. Frame
// writes happen on the caller's goroutine under wmu. The keepalive check
// runs on a timer.
//
// Locks: wmu (frame writes, hpack encoder) may be taken before mu, never
// after it. mu guards every field marked so below and every Tunnel field
// marked "under c.mu".
type conn struct {
	nc     net.Conn
	raw    *rawConn // the socket under nc's TLS, for write batching; nil in tests
	client bool
	cfg    H2Settings
	// advMaxStreams is the SETTINGS_MAX_CONCURRENT_STREAMS we advertise
	// (server); 0 means not advertised.
	advMaxStreams uint32
	// maxHeaderList bounds a decoded header list.
	maxHeaderList uint32
	peer          identity.Identity // verified TLS peer identity
	ctx           context.Context   // cancelled when the connection ends
	cancel        context.CancelFunc

	// hooks, set before start, called without locks held.
	onStream  func(t *Tunnel, fields []hpack.HeaderField) // server: a new request stream
	onRefused func(total int)                             // server: a stream refused for the limit
	onClose   func(err error)                             // the connection ended

	// Read loop only.
	hdec       *hpack.Decoder
	fields     []hpack.HeaderField
	fieldsSize uint32
	fieldsBig  bool
	hdr        [frameHeaderLen]byte
	rbuf       []byte
	cont       headerBlock
	sawFrame   bool
	refused    int
	readActive atomic.Bool // a frame was read since the last keepalive check

	wmu  sync.Mutex
	henc *hpack.Encoder
	hbuf bytes.Buffer

	mu             sync.Mutex
	streams        map[uint32]*Tunnel // under mu
	nextID         uint32             // under mu; client: next stream id to open
	lastPeerStream uint32             // under mu; server: highest stream id the client opened
	active         int                // under mu; client: streams reserved or open; server: handlers running
	peerMaxFrame   uint32             // under mu
	peerInitWindow int64              // under mu
	peerMaxStreams uint32             // under mu
	sendWin        int64              // under mu; connection send window
	sendWinCh      chan struct{}      // under mu; closed and replaced when sendWin grows
	recvWin        int64              // under mu; what the peer may still send
	recvUnacked    int64              // under mu; consumed bytes not yet returned with WINDOW_UPDATE
	closing        bool               // under mu; no new streams (GOAWAY either way, idle expiry)
	sentGoAway     bool               // under mu
	closed         bool               // under mu
	closeErr       error              // under mu
	pingOut        bool               // under mu; a keepalive PING awaits its ACK
	pingSent       time.Time          // under mu
	pingSeq        uint64             // under mu
	done           chan struct{}      // closed when the connection ends
	ready          chan struct{}      // closed when the peer's first SETTINGS arrived
	ka             *time.Timer
	idleTimeout    time.Duration // client: close after this long without streams; 0: never
	idleSince      time.Time     // under mu
	idleTimer      *time.Timer   // under mu
	idleArmed      bool          // under mu
}

type headerBlock struct {
	sid       uint32
	endStream bool
	buf       []byte
}

func newConn(nc net.Conn, client bool, cfg H2Settings, peer identity.Identity, parent context.Context) *conn {
	c := &conn{
		nc:             nc,
		client:         client,
		cfg:            cfg.withDefaults(),
		peer:           peer,
		streams:        make(map[uint32]*Tunnel),
		nextID:         1,
		peerMaxFrame:   minFrameSize,
		peerInitWindow: defaultWindow,
		peerMaxStreams: ^uint32(0),
		sendWin:        defaultWindow,
		sendWinCh:      make(chan struct{}),
		recvWin:        defaultWindow,
		done:           make(chan struct{}),
		ready:          make(chan struct{}),
		maxHeaderList:  16 << 10,
	}
	c.ctx, c.cancel = context.WithCancel(parent)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.hdec = hpack.NewDecoder(4096, c.emitField)
	return c
}

// start writes the connection preface and settings and starts the read
// loop and keepalive. The caller sets hooks and limits before.
func (c *conn) start() error {
	c.hdec.SetMaxStringLength(int(c.maxHeaderList))
	settings := []struct {
		id  http2.SettingID
		val uint32
	}{
		{http2.SettingInitialWindowSize, c.cfg.StreamWindow},
		{http2.SettingMaxFrameSize, c.cfg.MaxFrameSize},
		{http2.SettingMaxHeaderListSize, c.maxHeaderList},
	}
	if c.client {
		settings = append(settings, struct {
			id  http2.SettingID
			val uint32
		}{http2.SettingEnablePush, 0})
	}
	if c.advMaxStreams > 0 {
		settings = append(settings, struct {
			id  http2.SettingID
			val uint32
		}{http2.SettingMaxConcurrentStreams, c.advMaxStreams})
	}
	var b []byte
	if c.client {
		b = append(b, clientPreface...)
	}
	off := len(b)
	b = append(b, make([]byte, frameHeaderLen+6*len(settings))...)
	putFrameHeader(b[off:], 6*len(settings), frameSettings, 0, 0)
	for i, s := range settings {
		p := b[off+frameHeaderLen+6*i:]
		binary.BigEndian.PutUint16(p, uint16(s.id))
		binary.BigEndian.PutUint32(p[2:], s.val)
	}
	if inc := int64(c.cfg.ConnWindow) - defaultWindow; inc > 0 {
		off = len(b)
		b = append(b, make([]byte, frameHeaderLen+4)...)
		putFrameHeader(b[off:], 4, frameWindowUpdate, 0, 0)
		binary.BigEndian.PutUint32(b[off+frameHeaderLen:], uint32(inc))
		c.recvWin += inc
	}
	c.wmu.Lock()
	err := c.writeLocked(b)
	c.wmu.Unlock()
	if err != nil {
		c.fail(err)
		return err
	}
	go c.readLoop()
	if c.cfg.KeepaliveInterval > 0 {
		c.mu.Lock()
		c.ka = time.AfterFunc(c.cfg.KeepaliveInterval, c.keepalive)
		c.mu.Unlock()
	}
	return nil
}

// ---- read side ----

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
			return fmt.Errorf("hbone: read client preface: %w", err)
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
	if cap(c.rbuf) > maxChunk {
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
	for rem > 0 {
		k := min(rem, maxChunk)
		if k >= 4<<10 {
			// Big enough to fill a chunk of its own: read straight into it.
			bp := getBuf(k)
			if _, err := io.ReadFull(c.nc, *bp); err != nil {
				putBuf(bp)
				return err
			}
			rem -= k
			c.mu.Lock()
			if t.err == nil && !t.closed {
				t.q.pushChunk(bp)
				c.mu.Unlock()
				t.wakeRead()
			} else {
				c.mu.Unlock()
				putBuf(bp)
				c.creditConn(int64(k))
			}
			continue
		}
		if cap(c.rbuf) < maxChunk {
			c.rbuf = make([]byte, maxChunk)
		}
		b := c.rbuf[:k]
		if _, err := io.ReadFull(c.nc, b); err != nil {
			return err
		}
		rem -= k
		c.mu.Lock()
		if t.err == nil && !t.closed {
			t.q.push(b)
			c.mu.Unlock()
			t.wakeRead()
		} else {
			// The stream went away while we read: return the window.
			c.mu.Unlock()
			c.creditConn(int64(k))
		}
	}
	if err := c.discardPad(pad); err != nil {
		return err
	}
	if flags&flagEndStream != 0 {
		c.mu.Lock()
		t.remoteEnd = true
		gone := c.maybeRemoveLocked(t)
		c.mu.Unlock()
		t.wakeRead()
		c.afterRemove(gone)
	}
	return nil
}

func (c *conn) discardPad(pad int) error {
	if pad == 0 {
		return nil
	}
	_, err := io.CopyN(io.Discard, c.nc, int64(pad))
	return err
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
	c.mu.Lock()
	t.remoteEnd = true
	gone := c.maybeRemoveLocked(t)
	c.mu.Unlock()
	t.wakeRead()
	c.afterRemove(gone)
	return nil
}

func (c *conn) onResponseHeaders(sid uint32, endStream bool) error {
	c.mu.Lock()
	t := c.streams[sid]
	if t == nil {
		idle := c.isIdleStreamLocked(sid)
		c.mu.Unlock()
		if idle {
			return protoErr("HEADERS on idle stream %d", sid)
		}
		return nil // a stream we already reset
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
	c.mu.Lock()
	t := c.streams[sid]
	if t == nil {
		idle := c.isIdleStreamLocked(sid)
		c.mu.Unlock()
		if idle {
			return protoErr("WINDOW_UPDATE on idle stream %d", sid)
		}
		return nil
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
	c.mu.Lock()
	t := c.streams[sid]
	if t == nil {
		idle := c.isIdleStreamLocked(sid)
		c.mu.Unlock()
		if idle {
			return protoErr("RST_STREAM on idle stream %d", sid)
		}
		return nil
	}
	var e error = &StreamResetError{Code: code, Remote: true}
	if code == http2.ErrCodeRefusedStream && c.client && t.status == 0 {
		e = fmt.Errorf("%w: %w", errRetry, e)
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
	if length > 8+1024 {
		// Keep the first KiB of debug data, skip the rest.
		p, err := c.payload(8 + 1024)
		if err != nil {
			return err
		}
		if _, err := io.CopyN(io.Discard, c.nc, int64(length)-8-1024); err != nil {
			return err
		}
		length = uint32(len(p))
	}
	p, err := c.payload(length)
	if err != nil {
		return err
	}
	last := binary.BigEndian.Uint32(p) & maxStreamID
	code := http2.ErrCode(binary.BigEndian.Uint32(p[4:]))
	c.mu.Lock()
	c.closing = true
	var failed []*Tunnel
	if c.client {
		for id, t := range c.streams {
			if id > last && t.err == nil {
				t.err = fmt.Errorf("%w: GOAWAY (%s) above stream %d", errRetry, code, last)
				failed = append(failed, t)
			}
		}
	}
	gone := false
	for _, t := range failed {
		gone = c.removeLocked(t) || gone
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
		return fmt.Errorf("hbone: peer sent GOAWAY %s: %q", code, p[8:])
	}
	_ = gone
	return nil
}

// ---- stream bookkeeping ----

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
	closeNow := c.closing && c.active == 0 && !c.closed
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

// ---- write side ----

// writeFrame writes one frame; it takes wmu.
func (c *conn) writeFrame(typ, flags uint8, sid uint32, p []byte) error {
	c.wmu.Lock()
	err := c.writeFrameLocked(typ, flags, sid, p)
	c.wmu.Unlock()
	return err
}

func (c *conn) writeFrameLocked(typ, flags uint8, sid uint32, p []byte) error {
	if len(p) > smallFrame && c.raw != nil {
		var h [frameHeaderLen]byte
		putFrameHeader(h[:], len(p), typ, flags, sid)
		c.raw.startBatch()
		_, err := c.nc.Write(h[:])
		if err == nil {
			_, err = c.nc.Write(p)
		}
		if ferr := c.raw.flush(); err == nil {
			err = ferr
		}
		if err != nil {
			c.fail(err)
		}
		return err
	}
	bp := getBuf(frameHeaderLen + len(p))
	b := *bp
	putFrameHeader(b, len(p), typ, flags, sid)
	copy(b[frameHeaderLen:], p)
	err := c.writeLocked(b)
	putBuf(bp)
	if err != nil {
		c.fail(err) // callers hold wmu, never mu: fail may take mu
	}
	return err
}

// writeLocked writes b to the TLS connection as one socket write (see
// rawConn); the caller holds wmu.
func (c *conn) writeLocked(b []byte) error {
	if c.raw == nil {
		_, err := c.nc.Write(b)
		return err
	}
	c.raw.startBatch()
	_, err := c.nc.Write(b)
	if ferr := c.raw.flush(); err == nil {
		err = ferr
	}
	return err
}

// writeWindowUpdates sends a stream and/or connection WINDOW_UPDATE in one
// write.
func (c *conn) writeWindowUpdates(sid uint32, streamInc, connInc int64) {
	var b [2 * (frameHeaderLen + 4)]byte
	n := 0
	if streamInc > 0 {
		putFrameHeader(b[n:], 4, frameWindowUpdate, 0, sid)
		binary.BigEndian.PutUint32(b[n+frameHeaderLen:], uint32(streamInc))
		n += frameHeaderLen + 4
	}
	if connInc > 0 {
		putFrameHeader(b[n:], 4, frameWindowUpdate, 0, 0)
		binary.BigEndian.PutUint32(b[n+frameHeaderLen:], uint32(connInc))
		n += frameHeaderLen + 4
	}
	if n == 0 {
		return
	}
	bp := getBuf(n)
	copy(*bp, b[:n])
	c.wmu.Lock()
	err := c.writeLocked(*bp)
	c.wmu.Unlock()
	putBuf(bp)
	if err != nil {
		c.fail(err)
	}
}

// writeHeaders encodes fields and writes them as one HEADERS frame (plus
// CONTINUATION frames if the block exceeds the peer's frame size).
func (c *conn) writeHeaders(sid uint32, endStream bool, fields ...hpack.HeaderField) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeHeadersLocked(sid, endStream, fields...)
}

func (c *conn) writeHeadersLocked(sid uint32, endStream bool, fields ...hpack.HeaderField) error {
	c.hbuf.Reset()
	for _, f := range fields {
		if err := c.henc.WriteField(f); err != nil {
			return err
		}
	}
	c.mu.Lock()
	maxFrame := int(c.peerMaxFrame)
	c.mu.Unlock()
	block := c.hbuf.Bytes()
	var flags uint8
	if endStream {
		flags |= flagEndStream
	}
	typ := uint8(frameHeaders)
	for {
		chunk := block
		if len(chunk) > maxFrame {
			chunk = chunk[:maxFrame]
		}
		block = block[len(chunk):]
		f := flags
		if len(block) == 0 {
			f |= flagEndHeaders
		}
		if err := c.writeFrameLocked(typ, f, sid, chunk); err != nil {
			return err
		}
		if len(block) == 0 {
			return nil
		}
		typ, flags = frameContinuation, 0
	}
}

func (c *conn) writeGoAway(last uint32, code http2.ErrCode, debug string) {
	if len(debug) > 256 {
		debug = debug[:256]
	}
	p := make([]byte, 8+len(debug))
	binary.BigEndian.PutUint32(p, last)
	binary.BigEndian.PutUint32(p[4:], uint32(code))
	copy(p[8:], debug)
	c.mu.Lock()
	c.sentGoAway = true
	c.closing = true
	c.mu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	c.writeFrame(frameGoAway, 0, 0, p)
}

// resetStreamID sends RST_STREAM for a stream this side does not track.
func (c *conn) resetStreamID(sid uint32, code http2.ErrCode) {
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], uint32(code))
	c.writeFrame(frameRSTStream, 0, sid, p[:])
}

// ---- lifecycle ----

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
	if err != nil && c.raw != nil {
		// Broken or hostile peer: do not let TLS's close_notify wait on it.
		c.raw.Close()
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

// streamErrLocked is the error streams get once the connection ended.
func (c *conn) streamErrLocked() error {
	if c.closeErr == nil {
		return ErrConnClosed
	}
	return fmt.Errorf("%w: %w", ErrConnClosed, classifyConnErr(c.closeErr))
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
			c.fail(fmt.Errorf("hbone: keepalive PING not answered within %s", c.cfg.KeepaliveTimeout))
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
