package proxy

import (
	"io"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
	"golang.org/x/sys/unix"
)

// TestSocketCounts checks the probe's readings on a real connection: what
// the peer acknowledged of our writes, and what we consumed of its writes
// (unread bytes do not count), and that a reading allocates no more than
// the RawConn the net package makes per SyscallConn.
func TestSocketCounts(t *testing.T) {
	tc, peer := testkit.TCPPair(t)

	if _, err := tc.Write(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Write(make([]byte, 300)); err != nil {
		t.Fatal(err)
	}
	// Loopback acknowledges at once, but not within the write call.
	deadline := time.Now().Add(5 * time.Second)
	for tcpAcked(tc) != 1000 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := tcpAcked(tc); got != 1000 {
		t.Fatalf("tcpAcked = %d, want 1000", got)
	}
	if tcpConsumed(peer) != 0 {
		t.Fatal("the peer has read nothing yet, tcpConsumed must be 0")
	}
	if _, err := io.ReadFull(tc, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if got := tcpConsumed(tc); got != 100 {
		t.Fatalf("tcpConsumed = %d after reading 100 of 300, want 100", got)
	}
	if n := testing.AllocsPerRun(100, func() { tcpConsumed(tc); tcpAcked(tc) }); n > 2 {
		t.Fatalf("a pair of readings allocates %v times, want at most 2 (the RawConns)", n)
	}
	// A half-close's FIN takes a sequence number too, not a byte.
	if err := tc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(peer); err != nil {
		t.Fatal(err)
	}
	for finAcked := false; !finAcked; time.Sleep(time.Millisecond) {
		s := readSock(tc, false)
		finAcked = s.ok && s.info.State == unix.BPF_TCP_FIN_WAIT2
		sockReadPool.Put(s)
		if !finAcked && time.Now().After(deadline) {
			t.Fatal("the half-close's FIN was not acknowledged in 5s")
		}
	}
	if got := tcpAcked(tc); got != 1000 {
		t.Fatalf("tcpAcked after a half-close = %d, want 1000", got)
	}
	tc.Close()
	if got := tcpConsumed(tc); got != 0 {
		t.Fatalf("tcpConsumed on a closed connection = %d, want 0", got)
	}
}
