package dnsproxy

import (
	"context"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Two servers on one port with ReusePort: every UDP query goes to the
// newer one (the old one's socket gets none, so nothing can be queued on
// it when it closes), the old one's Drain ends as soon as it is quiet, and
// the port keeps answering.
func TestReusePortHandOver(t *testing.T) {
	old := startServer(t, Config{ReusePort: true}, nil)
	q := new(dns.Msg)
	q.SetQuestion("external.example.", dns.TypeA)
	exchange(t, "udp", old.addr, q)
	if got := testutil.CollectAndCount(old.Server.metrics.requests); got != 1 {
		t.Fatalf("old server alone: %d request series, want 1", got)
	}
	nu := startServer(t, Config{ReusePort: true, ListenAddrs: old.Addrs()}, nil)
	if nu.addr != old.addr {
		t.Fatalf("new server on %s, want the old one's %s", nu.addr, old.addr)
	}
	const n = 40
	for range n {
		exchange(t, "udp", old.addr, q) // a new client socket (source port) each time
	}
	sum := func(ts *testServer) float64 {
		return testutil.ToFloat64(ts.Server.metrics.requests.WithLabelValues("a", "udp", "client-app", "v1"))
	}
	if o, w := sum(old), sum(nu); o != 1 || w != n {
		t.Fatalf("after the new server bound: old answered %v, new %v; want 1 and %d", o, w, n)
	}
	start := time.Now()
	old.Drain(context.Background(), 10*time.Second)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Drain of an idle, steered-away server took %v", d)
	}
	for range 5 {
		exchange(t, "udp", old.addr, q)
		exchange(t, "tcp", old.addr, q)
	}
	if w := sum(nu); w != n+5 {
		t.Fatalf("after the drain the new server answered %v UDP queries, want %d", w, n+5)
	}
}
