package hbone

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// The drain's writev delivers every buffer whole and in order through
// partial writes and waits for room (a small send buffer, a slow reader),
// skips empty buffers, and honours the write deadline.
func TestSinkWriterWritev(t *testing.T) {
	a, b := testkit.TCPPair(t)
	if err := a.SetWriteBuffer(8 << 10); err != nil {
		t.Fatal(err)
	}
	w := newSinkWriter(a)
	if w == nil {
		t.Fatal("no sinkWriter for a TCP connection")
	}
	var want []byte
	var bufs [][]byte
	for i := range drainBatch {
		n := (i * 37 << 10) % (300 << 10)
		if i == 3 {
			n = 0
		}
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(i*31 + j)
		}
		bufs = append(bufs, p)
		want = append(want, p...)
	}
	got := make(chan []byte, 1)
	go func() {
		var out bytes.Buffer
		buf := make([]byte, 4<<10)
		for out.Len() < len(want) {
			time.Sleep(50 * time.Microsecond)
			n, err := b.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				break
			}
		}
		got <- out.Bytes()
	}()
	n, err := w.writev(bufs)
	if err != nil || n != int64(len(want)) {
		t.Fatalf("writev = %d, %v; want %d", n, err, len(want))
	}
	if g := <-got; !bytes.Equal(g, want) {
		t.Fatalf("received %d bytes, not the %d written in order", len(g), len(want))
	}

	// Nothing to write: nothing happens.
	if n, err := w.writev([][]byte{nil, {}}); n != 0 || err != nil {
		t.Fatalf("writev of empty buffers = %d, %v", n, err)
	}

	// A full socket past the deadline: the deadline's error.
	a.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	big := make([]byte, 64<<20)
	_, err = w.writev([][]byte{big})
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("writev past the deadline: %v", err)
	}
	a.SetWriteDeadline(time.Time{})

	// A reset peer: an error, not a hang.
	b.SetLinger(0)
	b.Close()
	for range 100 {
		if _, err = w.writev([][]byte{make([]byte, 1<<20)}); err != nil {
			break
		}
	}
	if err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("writev to a reset peer: %v", err)
	}
}
