package wire

import (
	"bufio"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"testing"
)

// TestParseFields: heads in the subset read as net/textproto reads them;
// the others are left to it.
func TestParseFields(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"Host: a\r\n\r\n", true},
		{"host: a\r\nX-A:1\r\nx-a: \t2 \r\nEmpty:\r\n\r\n", true},
		{"Content-Type: text/plain; charset=utf-8\r\nUser-Agent: x/1 (y z)\r\n\r\n", true},
		{"\r\n", true},
		{"Host: a\n\n", false},               // bare LF
		{"Host: a\r\nX Y: 1\r\n\r\n", false}, // a space in the name
		{"Host: a\r\n X: 1\r\n\r\n", false},  // folded
		{": a\r\n\r\n", false},
		{"Host a\r\n\r\n", false},
		{"X: caf\xc3\xa9\r\n\r\n", false}, // obs-text: net/http decides
		{"X: a\x00b\r\n\r\n", false},
		{"Host: a\r\n\r\nmore", false},
	} {
		h, ok := ParseFields(tc.in, 0)
		if ok != tc.ok {
			t.Errorf("ParseFields(%q) ok = %v, want %v", tc.in, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		ref, err := textproto.NewReader(bufio.NewReader(strings.NewReader(tc.in))).ReadMIMEHeader()
		if err != nil {
			t.Errorf("%q: net/textproto: %v", tc.in, err)
			continue
		}
		if !maps.EqualFunc(h, http.Header(ref), slices.Equal) {
			t.Errorf("ParseFields(%q) = %v, net/textproto %v", tc.in, h, ref)
		}
	}
}

// TestBody: a Content-Length body ends as net/http's does.
func TestBody(t *testing.T) {
	src := func(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }

	b := NewBody(src("hello, next"), 5, false)
	p := make([]byte, 10)
	if n, err := b.Read(p); n != 5 || err != io.EOF {
		t.Errorf("the read that takes the last byte: %d, %v; want 5, EOF", n, err)
	}
	if n, err := b.Read(p); n != 0 || err != io.EOF {
		t.Errorf("after the end: %d, %v", n, err)
	}

	b = NewBody(src("hel"), 5, false)
	if got, err := io.ReadAll(b); string(got) != "hel" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut short: %q, %v; want io.ErrUnexpectedEOF", got, err)
	}

	r := src("hello, next")
	b = NewBody(r, 5, false)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if rest, _ := io.ReadAll(r); string(rest) != ", next" {
		t.Errorf("Close left %q, want the next message's bytes", rest)
	}
	if _, err := b.Read(p); err != http.ErrBodyReadAfterClose {
		t.Errorf("Read after Close: %v", err)
	}

	r = src("hello, next")
	b = NewBody(r, 5, true)
	_ = b.Close()
	if rest, _ := io.ReadAll(r); string(rest) != "hello, next" {
		t.Errorf("Close of a closing connection's body read %q; want nothing read", rest)
	}

	b = NewBody(src("hel"), 5, false)
	if err := b.Close(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("Close of a body cut short: %v", err)
	}
}

// TestBufferPoolPutAllocs: returning a buffer allocates nothing, and a
// buffer cut from its front is not lent again as a whole one.
func TestBufferPoolPutAllocs(t *testing.T) {
	var p BufferPool
	buf := p.Get()
	if n := testing.AllocsPerRun(100, func() { p.Put(buf); buf = p.Get() }); n != 0 {
		t.Errorf("Put and Get allocate %.1f times, want 0", n)
	}
	if len(buf) != 32<<10 {
		t.Fatalf("Get returned %d bytes, want 32 KiB", len(buf))
	}
	p.Put(buf[1:]) // dropped: its capacity is not a whole buffer's
	for range 10 {
		if b := p.Get(); len(b) != 32<<10 || cap(b) != 32<<10 {
			t.Fatalf("Get returned len %d cap %d", len(b), cap(b))
		}
	}
}
