package main

import (
	"context"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// lab is the benchmark's setup in one process: app, destination node
// proxy, east-west gateway and client, as run() starts them as children.
type lab struct {
	cl   *client
	dest *dest
	gw   *gateway
}

func newLab(t *testing.T) *lab {
	t.Helper()
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	certs := map[identity.Identity]*identity.StaticSource{}
	for _, id := range []identity.Identity{clientID, destID, gatewayID} {
		if certs[id], err = issue(c, id); err != nil {
			t.Fatal(err)
		}
	}
	ln, app, err := startApp()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	d, err := startDest(certs[destID], app)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	g, err := startGateway(certs[gatewayID], d.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return &lab{cl: &client{certs: certs[clientID], app: app, dest: d.addr, gateway: g.addr}, dest: d, gw: g}
}

func (l *lab) forwarded(t *testing.T) float64 {
	t.Helper()
	n, err := l.gw.forwarded()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCrossNetworkGoesThroughGateway: the cross-network path's tunnel is
// forwarded by the east-west gateway (its counter moves) to the
// destination's node proxy as an inner CONNECT by hostname from another
// network, with the client's identity; the same-network path reaches the
// node proxy by ip:port and leaves the gateway alone.
func TestCrossNetworkGoesThroughGateway(t *testing.T) {
	l := newLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := l.cl.pool()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	msg, got := []byte("across networks"), make([]byte, len("across networks"))

	tun, err := l.cl.cross(ctx, p)
	if err != nil {
		t.Fatalf("cross: %v", err)
	}
	if err := exchange(tun, msg, got); err != nil {
		t.Fatalf("cross echo: %v", err)
	}
	if id := tun.PeerIdentity(); id != destID {
		t.Errorf("cross tunnel's peer %s, want the destination %s (inner mTLS end to end)", id, destID)
	}
	tun.Close()
	if n := l.forwarded(t); n != 1 {
		t.Errorf("gateway forwarded %v outer streams after one cross-network tunnel, want 1", n)
	}
	if h, g := l.dest.byHost.Load(), l.dest.fromGateway.Load(); h != 1 || g != 1 {
		t.Errorf("destination saw %d hostname CONNECTs, %d from another network; want 1 and 1", h, g)
	}

	tun, err = l.cl.same(ctx, p)
	if err != nil {
		t.Fatalf("same: %v", err)
	}
	if err := exchange(tun, msg, got); err != nil {
		t.Fatalf("same echo: %v", err)
	}
	tun.Close()
	if n := l.forwarded(t); n != 1 {
		t.Errorf("gateway forwarded %v outer streams after a same-network tunnel, want still 1", n)
	}
	if a := l.dest.byAddr.Load(); a != 1 {
		t.Errorf("destination saw %d ip:port CONNECTs, want 1", a)
	}
}

// TestMeasureCountsGatewayStreams: a tiny measure run opens exactly the
// cross-network tunnels it reports, each one forwarded by the gateway,
// and yields a sample for every path (no timing is asserted).
func TestMeasureCountsGatewayStreams(t *testing.T) {
	l := newLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o := options{rounds: 2, connects: 3, requests: 4}
	res, err := measure(ctx, l.cl, o)
	if err != nil {
		t.Fatal(err)
	}
	// Per round, two cross paths of `connects` each; plus the reused one.
	if want := 2*o.rounds*o.connects + 1; res.crossTunnels != want {
		t.Errorf("crossTunnels %d, want %d", res.crossTunnels, want)
	}
	if n := l.forwarded(t); n != float64(res.crossTunnels) {
		t.Errorf("gateway forwarded %v, the run opened %d cross-network tunnels", n, res.crossTunnels)
	}
	for _, p := range res.newConn {
		if len(p.samples) != o.rounds*o.connects {
			t.Errorf("%s: %d new-connection samples, want %d", p.name, len(p.samples), o.rounds*o.connects)
		}
	}
	for _, p := range res.reused {
		if len(p.samples) != o.rounds*o.requests {
			t.Errorf("%s: %d request samples, want %d", p.name, len(p.samples), o.rounds*o.requests)
		}
	}
}
