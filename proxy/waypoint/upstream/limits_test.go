package upstream

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

// TestLimits: a DestinationRule's maxRequestsPerConnection closes a kept
// connection after that many requests, and its idleTimeout closes one
// idle that long, so the next request dials anew.
func TestLimits(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(rw, "ok") }))
	t.Cleanup(srv.Close)
	target := netip.MustParseAddrPort(srv.Listener.Addr().String())
	dials := 0
	h := NewHeld(&Pool{}, func(ctx context.Context, _ netip.AddrPort, _ string) (net.Conn, error) {
		dials++
		var d net.Dialer
		return d.DialContext(ctx, "tcp", target.String())
	})
	t.Cleanup(h.Close)
	send := func(lim Limits) {
		t.Helper()
		r, _ := http.NewRequest(http.MethodGet, "http://"+target.String()+"/", nil)
		a := h.RoundTrip(target, r, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), nil, false, time.Time{}, lim)
		if a.Err != nil {
			t.Fatal(a.Err)
		}
		_, err := io.ReadAll(a.Resp.Body)
		h.Done(a.Conn, err == nil, false)
	}
	for range 6 {
		send(Limits{MaxUses: 2})
	}
	if dials != 3 {
		t.Errorf("6 requests with MaxUses 2 dialled %d connections, want 3", dials)
	}
	dials = 0
	send(Limits{IdleTimeout: 20 * time.Millisecond})
	time.Sleep(200 * time.Millisecond)
	send(Limits{IdleTimeout: 20 * time.Millisecond})
	if dials != 2 {
		t.Errorf("two requests 200ms apart with IdleTimeout 20ms dialled %d connections, want 2", dials)
	}
}
