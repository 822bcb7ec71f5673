package hbone

import (
	"context"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestReplyServe: a handler that answers with Serve gets the tunnel itself
// after the 200: it reads and writes it (here: upper-cases what arrives
// until the client's half-close), the server closes it when Serve returns,
// and Done sees the byte counts and Serve's error.
func TestReplyServe(t *testing.T) {
	m := newMesh(t)
	type result struct {
		stats TunnelStats
		err   error
	}
	done := make(chan result, 1)
	srv := startServer(t, m, HandlerFunc(func(ctx context.Context, req *Request) Reply {
		return Reply{
			Serve: func(tun *Tunnel) error {
				b, err := io.ReadAll(tun)
				if err != nil {
					return err
				}
				_, err = tun.Write([]byte(strings.ToUpper(string(b))))
				return err
			},
			Done: func(s TunnelStats, err error) { done <- result{s, err} },
		}
	}))
	p := newPool(t, m)
	tun := mustConnect(t, p, connectReq(srv, netip.MustParseAddrPort("127.0.0.1:9")))
	defer tun.Close()
	if _, err := tun.Write([]byte("served in the tunnel")); err != nil {
		t.Fatal(err)
	}
	if err := tun.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	tun.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(tun) // EOF: the server closed the tunnel after Serve
	if err != nil || string(got) != "SERVED IN THE TUNNEL" {
		t.Fatalf("read %q, %v; want the upper-cased message, then EOF", got, err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.stats.BytesReceived != 20 || r.stats.BytesSent != 20 {
			t.Errorf("Done(%+v, %v), want 20 bytes each way and no error", r.stats, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Done not called")
	}
}
