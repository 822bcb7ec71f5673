package hbone

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
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
// server-side connection: it must neither panic nor hang, whatever the
// frames say.
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
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		c := newConn(a, false, H2Settings{KeepaliveInterval: -1}, clientID, context.Background())
		c.advMaxStreams = 4
		c.onStream = func(t *Tunnel, fields []hpack.HeaderField) {
			if _, status, _ := parseRequest(fields, false); status != 0 {
				t.respond(status, "")
				c.releaseSlot()
				return
			}
			go func() {
				defer c.releaseSlot()
				t.respond(200, "")
				io.Copy(io.Discard, t)
				t.Close()
			}()
		}
		done := make(chan struct{})
		c.onClose = func(error) { close(done) }
		go io.Copy(io.Discard, b) // whatever the server writes
		go func() {
			b.Write([]byte(http2.ClientPreface))
			b.Write(in)
			b.Close()
		}()
		if err := c.start(); err != nil {
			return
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("connection did not end after its input did")
		}
	})
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
