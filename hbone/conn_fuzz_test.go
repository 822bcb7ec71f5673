package hbone

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// frame builds one raw HTTP/2 frame for seeds.
func frame(typ, flags uint8, sid uint32, payload []byte) []byte {
	b := make([]byte, frameHeaderLen+len(payload))
	putFrameHeader(b, len(payload), typ, flags, sid)
	copy(b[frameHeaderLen:], payload)
	return b
}

func hpackBlock(kv ...string) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for i := 0; i < len(kv); i += 2 {
		enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return buf.Bytes()
}

// FuzzServerFrames feeds arbitrary bytes after the client preface to a
// server-side connection and keeps the pipe open: the connection must end or
// stay usable within a bound, whatever the frames say.
func FuzzServerFrames(f *testing.F) {
	settings := frame(frameSettings, 0, 0, nil)
	connect := frame(frameHeaders, flagEndHeaders, 1, hpackBlock(":method", "CONNECT", ":authority", "10.0.0.1:80"))
	wu := make([]byte, 4)
	binary.BigEndian.PutUint32(wu, 1000)
	f.Add(settings)
	f.Add(bytes.Join([][]byte{settings, connect, frame(frameData, flagEndStream, 1, []byte("hi"))}, nil))
	f.Add(bytes.Join([][]byte{settings, connect, frame(frameWindowUpdate, 0, 1, wu), frame(frameRSTStream, 0, 1, []byte{0, 0, 0, 8})}, nil))
	f.Add(bytes.Join([][]byte{settings, frame(frameHeaders, 0, 1, hpackBlock(":method", "CONNECT")),
		frame(frameContinuation, flagEndHeaders, 1, hpackBlock(":authority", "1.2.3.4:5"))}, nil))
	f.Add(bytes.Join([][]byte{settings, frame(framePing, 0, 0, make([]byte, 8)), frame(frameGoAway, 0, 0, make([]byte, 8))}, nil))
	f.Add(bytes.Join([][]byte{settings, frame(frameData, flagPadded, 1, []byte{5, 1})}, nil))
	f.Add(bytes.Join([][]byte{settings, connect, frame(frameGoAway, 0, 0, make([]byte, 8+2000))}, nil))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, in []byte) {
		serveFrames(t, in)
	})
}

// probe is the payload of the PING serveFrames sends after the input.
var probe = [8]byte{'z', 't', '-', 'p', 'r', 'o', 'b', 'e'}

type frameOutcome int

const (
	connEnded    frameOutcome = iota + 1 // the connection closed
	connAnswered                         // the connection acknowledged the probe PING
)

// serveFrames writes the client preface and in to a server-side connection
// over a pipe it keeps open. It then completes a frame in cut short with
// zeros and sends a PING. Within the bound the connection must either end or
// acknowledge that PING; otherwise it misread the frames and is waiting for
// bytes no peer will send, which a closed pipe would hide as EOF.
func serveFrames(t testing.TB, in []byte) frameOutcome {
	if bytes.Contains(in, probe[:]) {
		return 0 // an echo of the input would look like an answer
	}
	a, b := net.Pipe()
	cfg := H2Settings{KeepaliveInterval: -1}
	c := newConn(a, false, cfg, clientID, context.Background())
	c.advMaxStreams = 4
	var handlers sync.WaitGroup
	c.onStream = func(t *Tunnel, fields []hpack.HeaderField) {
		if _, status, _ := parseRequest(fields, false); status != 0 {
			t.respond(status, "")
			c.releaseSlot()
			return
		}
		handlers.Go(func() {
			defer c.releaseSlot()
			t.respond(200, "")
			io.Copy(io.Discard, t)
			t.Close()
		})
	}
	done := make(chan struct{})
	c.onClose = func(error) { close(done) }
	answered := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { readProbeAck(b, answered) })
	bg.Go(func() {
		b.Write([]byte(http2.ClientPreface))
		b.Write(completeFrames(in, c.cfg.MaxFrameSize))
		b.Write(frame(framePing, 0, 0, probe[:]))
	})
	defer func() {
		b.Close()
		<-done
		bg.Wait()
		handlers.Wait()
	}()
	if err := c.start(); err != nil {
		return connEnded
	}
	select {
	case <-done:
		return connEnded
	case <-answered:
		return connAnswered
	case <-time.After(5 * time.Second):
		t.Fatal("connection neither ended nor answered a PING after its input")
		return 0
	}
}

// completeFrames pads a final frame that in cuts short with zeros, so that
// the bytes after in start a new frame. A frame longer than the connection
// accepts is left alone: the connection rejects its header.
func completeFrames(in []byte, maxFrame uint32) []byte {
	off := 0
	for len(in)-off >= frameHeaderLen {
		n := int(in[off])<<16 | int(in[off+1])<<8 | int(in[off+2])
		if n > int(maxFrame) {
			return in
		}
		off += frameHeaderLen + n
	}
	if off == len(in) {
		return in
	}
	out := append([]byte(nil), in...)
	if len(in) < off { // the payload is short
		return append(out, make([]byte, off-len(in))...)
	}
	out = append(out, make([]byte, frameHeaderLen-(len(in)-off))...) // the header is short
	h := out[off:]
	if n := int(h[0])<<16 | int(h[1])<<8 | int(h[2]); n <= int(maxFrame) {
		out = append(out, make([]byte, n)...)
	}
	return out
}

// readProbeAck reads the server's frames until the pipe closes and closes
// answered on the acknowledgement of the probe PING.
func readProbeAck(r io.Reader, answered chan<- struct{}) {
	var hdr [frameHeaderLen]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		p := make([]byte, n)
		if _, err := io.ReadFull(r, p); err != nil {
			return
		}
		if hdr[3] == framePing && hdr[4]&flagAck != 0 && bytes.Equal(p, probe[:]) && answered != nil {
			close(answered)
			answered = nil
		}
	}
}

// TestGoAwayLongDebugData: a GOAWAY with more than a KiB of debug data is
// read once. The read loop used to read its first KiB a second time and then
// wait for bytes the peer never sent.
func TestGoAwayLongDebugData(t *testing.T) {
	settings := frame(frameSettings, 0, 0, nil)
	connect := frame(frameHeaders, flagEndHeaders, 1, hpackBlock(":method", "CONNECT", ":authority", "10.0.0.1:80"))
	goAway := func(debug int) []byte {
		p := make([]byte, 8+debug)
		binary.BigEndian.PutUint32(p, 1)
		for i := range debug {
			p[8+i] = 'd'
		}
		return frame(frameGoAway, 0, 0, p)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want frameOutcome
	}{
		// An idle connection ends on a NO_ERROR GOAWAY.
		{"idle short", bytes.Join([][]byte{settings, goAway(10)}, nil), connEnded},
		{"idle long", bytes.Join([][]byte{settings, goAway(5000)}, nil), connEnded},
		// A connection with an open stream stays usable until it drains.
		{"open stream short", bytes.Join([][]byte{settings, connect, goAway(10)}, nil), connAnswered},
		{"open stream long", bytes.Join([][]byte{settings, connect, goAway(1025)}, nil), connAnswered},
		{"open stream longer", bytes.Join([][]byte{settings, connect, goAway(5000)}, nil), connAnswered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := serveFrames(t, tc.in); got != tc.want {
				t.Errorf("outcome %d, want %d", got, tc.want)
			}
		})
	}
}

// FuzzParseRequest checks the request validator on arbitrary header lists
// ("name: value" lines).
func FuzzParseRequest(f *testing.F) {
	f.Add(":method: CONNECT\n:authority: 10.0.0.1:80\nbaggage: a=b\ntraceparent: x")
	f.Add(":method: GET\n:path: /\n:authority: a")
	f.Add(":authority: [::1]:1\n:method: CONNECT\nForwarded: x")
	f.Fuzz(func(t *testing.T, s string) {
		var fields []hpack.HeaderField
		for _, line := range strings.Split(s, "\n") {
			name, value, _ := strings.Cut(line, ": ")
			fields = append(fields, hpack.HeaderField{Name: name, Value: value})
		}
		req, status, reason := parseRequest(fields, false)
		switch {
		case status == 0 && (req == nil || !req.Authority.IsValid() || reason != ""):
			t.Fatalf("accepted %q with %+v", s, req)
		case status != 0 && (status != 400 || reason == ""):
			t.Fatalf("rejected %q with %d %q", s, status, reason)
		}
	})
}
