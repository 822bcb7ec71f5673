package hbone

import (
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/net/http2"
)

// HTTP/2 frame types and flags (RFC 9113 section 6).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	framePriority     = 0x2
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePushPromise  = 0x5
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	frameHeaderLen = 9
	maxStreamID    = 1<<31 - 1
	maxWindow      = 1<<31 - 1
	defaultWindow  = 65535
	minFrameSize   = 16384
	maxFrameSizeHi = 1<<24 - 1
	clientPreface  = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

	// maxDataPayload bounds one DATA frame we write: 64 KiB, four full TLS
	// records, sent with one socket write (see rawConn).
	maxDataPayload = 64 << 10
	// smallFrame: payloads up to this size are copied next to their frame
	// header, so frame and payload travel in one TLS record (the largest
	// record holds 16 KiB); larger ones are written after it without a
	// copy (one more record, same socket write). A record costs a seal, 22
	// bytes on the wire and, on the reading side, an open and an allocation
	// in crypto/tls; copying up to 16 KiB costs less.
	smallFrame = 16<<10 - frameHeaderLen
)

// H2Settings tunes the HTTP/2 layer of a Server or Pool. Zero fields take
// the defaults, which are Istio ztunnel's.
type H2Settings struct {
	// StreamWindow is the receive window of each stream; 0 means 4 MiB.
	StreamWindow uint32
	// ConnWindow is the receive window of each connection; 0 means 16 MiB.
	ConnWindow uint32
	// MaxFrameSize is the largest frame this side accepts (advertised as
	// SETTINGS_MAX_FRAME_SIZE); 0 means 1 MiB.
	MaxFrameSize uint32
	// KeepaliveInterval: a PING is sent when nothing was read for this long;
	// 0 means 10 s, negative disables keepalive.
	KeepaliveInterval time.Duration
	// KeepaliveTimeout: the connection is closed when a PING is not
	// answered within this time; 0 means 20 s.
	KeepaliveTimeout time.Duration
}

func (s H2Settings) withDefaults() H2Settings {
	if s.StreamWindow == 0 {
		s.StreamWindow = 4 << 20
	}
	if s.ConnWindow == 0 {
		s.ConnWindow = 16 << 20
	}
	if s.MaxFrameSize == 0 {
		s.MaxFrameSize = 1 << 20
	}
	s.StreamWindow = min(max(s.StreamWindow, defaultWindow), maxWindow)
	s.ConnWindow = min(max(s.ConnWindow, defaultWindow), maxWindow)
	s.MaxFrameSize = min(max(s.MaxFrameSize, minFrameSize), maxFrameSizeHi)
	if s.KeepaliveInterval == 0 {
		s.KeepaliveInterval = 10 * time.Second
	}
	if s.KeepaliveTimeout <= 0 {
		s.KeepaliveTimeout = 20 * time.Second
	}
	return s
}

func putFrameHeader(b []byte, length int, typ, flags uint8, sid uint32) {
	b[0], b[1], b[2] = byte(length>>16), byte(length>>8), byte(length)
	b[3], b[4] = typ, flags
	binary.BigEndian.PutUint32(b[5:9], sid&maxStreamID)
}

// setting is one SETTINGS parameter (RFC 9113 section 6.5.1).
type setting struct {
	id  http2.SettingID
	val uint32
}

// appendSettings appends a SETTINGS frame carrying settings to b.
func appendSettings(b []byte, settings []setting) []byte {
	off := len(b)
	b = append(b, make([]byte, frameHeaderLen+6*len(settings))...)
	putFrameHeader(b[off:], 6*len(settings), frameSettings, 0, 0)
	for i, s := range settings {
		p := b[off+frameHeaderLen+6*i:]
		binary.BigEndian.PutUint16(p, uint16(s.id))
		binary.BigEndian.PutUint32(p[2:], s.val)
	}
	return b
}

// appendWindowUpdate appends a WINDOW_UPDATE frame for sid (0: the
// connection) to b.
func appendWindowUpdate(b []byte, sid, inc uint32) []byte {
	var f [frameHeaderLen + 4]byte
	putFrameHeader(f[:], 4, frameWindowUpdate, 0, sid)
	binary.BigEndian.PutUint32(f[frameHeaderLen:], inc)
	return append(b, f[:]...)
}

// connError is an HTTP/2 connection error: this side sends GOAWAY with the
// code and closes the connection.
type connError struct {
	code   http2.ErrCode
	reason string
}

func (e connError) Error() string {
	return fmt.Sprintf("http2 connection error %s: %s", e.code, e.reason)
}

func protoErr(format string, args ...any) error {
	return connError{http2.ErrCodeProtocol, fmt.Sprintf(format, args...)}
}
