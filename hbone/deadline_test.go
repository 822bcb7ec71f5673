package hbone

import (
	"errors"
	"os"
	"testing"
	"time"
)

// TestTunnelDeadlineWakesBlockedRead: a deadline set while a Read is
// already blocked (no deadline before) ends that Read, as net.Conn
// requires; clearing it lets the next Read wait for data again.
func TestTunnelDeadlineWakesBlockedRead(t *testing.T) {
	m, up, srv := echoSetup(t)
	p := newPool(t, m)
	tun := mustConnect(t, p, connectReq(srv, up.addr))
	defer tun.Close()
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 16)
		_, err := tun.Read(buf) // the echo server sends nothing unasked
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the Read is blocked
	if err := tun.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("blocked Read ended with %v, want os.ErrDeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a deadline set while the Read was blocked did not end it")
	}
	if err := tun.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, tun, "after the deadline was cleared")
}
