package hbone

import (
	"encoding/binary"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The write side of conn: frames are written on the caller's goroutine under
// wmu, each as one socket write where it can be.

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
	var arr [2 * (frameHeaderLen + 4)]byte
	b := arr[:0]
	if streamInc > 0 {
		b = appendWindowUpdate(b, sid, uint32(streamInc))
	}
	if connInc > 0 {
		b = appendWindowUpdate(b, 0, uint32(connInc))
	}
	if len(b) == 0 {
		return
	}
	bp := getBuf(len(b))
	copy(*bp, b)
	c.wmu.Lock()
	err := c.writeLocked(*bp)
	c.wmu.Unlock()
	putBuf(bp)
	if err != nil {
		c.fail(err)
	}
}

// writeHeadersLocked encodes fields and writes them as one HEADERS frame
// (plus CONTINUATION frames if the block exceeds the peer's frame size); the
// caller holds wmu.
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
