package waypoint

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/routing"
)

// TestRouteAllocsWithoutNewPolicy: routing a request whose backend has no
// DestinationRule, or only loadBalancer.simple, allocates what it did
// before connectionPool, consistentHash and locality existed (3 and 6,
// measured on main before them with this test), less the two of the
// upstream's string the access log now writes from its parts (1 and 4).
func TestRouteAllocsWithoutNewPolicy(t *testing.T) {
	plain := &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: 1}
	simple := &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: 1,
		TrafficPolicy: &waypointapi.TrafficPolicy{LoadBalancer: waypointapi.LoadBalancer_ROUND_ROBIN}}
	// What the control plane sends for outlierDetection alone: Istio's
	// default locality failover comes with it.
	outlier := &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: 1,
		TrafficPolicy: &waypointapi.TrafficPolicy{OutlierDetection: &waypointapi.OutlierDetection{ConsecutiveServerErrors: 5,
			IntervalMs: 10000, BaseEjectionTimeMs: 30000, MaxEjectionPercent: 10}, Locality: &waypointapi.LocalityLb{}}}
	for _, tc := range []struct {
		name    string
		backend *waypointapi.Backend
		want    float64
	}{{"no DestinationRule", plain, 1}, {"simple", simple, 4}, {"outlierDetection (default locality failover)", outlier, 4}} {
		t.Run(tc.name, func(t *testing.T) { routeAllocs(t, tc.backend, tc.want) })
	}
}

func routeAllocs(t *testing.T, backend *waypointapi.Backend, want float64) {
	{
		l := subsetLab(t, &waypointapi.Route{Name: "r", Namespace: "demo", Kind: "VirtualService",
			Rules: []*waypointapi.RouteRule{{Backends: []*waypointapi.Backend{backend}}}})
		snap := l.w.sink.Load()
		dst := netip.MustParseAddrPort(svcVIP + ":80")
		table := l.w.sink.cfg.Load().services[dst.Addr()].routes
		req := httptest.NewRequest("GET", "http://server/", nil)
		src := netip.MustParseAddrPort(clientIP + ":5000")
		route := func() {
			res, err := l.w.router.Route(snap, src, dst, table, req, routing.Client{Namespace: "demo"})
			if err != nil {
				t.Fatal(err)
			}
			if res.Picked != nil {
				l.w.router.Done(context.Background(), res.Picked, "r", nil, nil)
			}
		}
		route()
		if got := testing.AllocsPerRun(200, route); got != want {
			t.Errorf("%v allocations per request, want %v", got, want)
		}
	}
}

// TestLimitedTransports: on net/http's path, maxRequestsPerConnection
// closes an upstream HTTP/1.1 connection after that many requests (an
// HTTP/2 one takes no more streams and closes once they end), and
// http.idleTimeout closes one idle that long.
func TestLimitedTransports(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(rw, "ok") }))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	w := &Waypoint{upstreamDial: func(ctx context.Context, _ netip.AddrPort, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}}
	t.Cleanup(w.closeLimited)
	send := func(tr http.RoundTripper, maxUses int) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
		var last *usedConn
		if maxUses > 1 {
			req = countUses(req, maxUses, &last)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if last != nil {
			last.Close()
		}
	}
	lt := w.transportsFor(connLimits{maxUses: 2})
	for range 6 {
		send(lt.h1, 2)
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("6 requests with maxRequestsPerConnection 2 used %d connections, want 3", n)
	}
	// HTTP/2 (h2c): the connection's second stream is its last.
	conns.Store(0)
	h2srv := httptest.NewUnstartedServer(h2c.NewHandler(srv.Config.Handler, &http2.Server{}))
	h2srv.Config.ConnState = srv.Config.ConnState
	h2srv.Start()
	t.Cleanup(h2srv.Close)
	h2addr := h2srv.Listener.Addr().String()
	addr = h2addr
	for range 6 {
		req, _ := http.NewRequest(http.MethodGet, "http://"+h2addr+"/", nil)
		var sent *http.Request
		sent = countStreams(req, 2, &sent)
		resp, err := lt.h2.RoundTrip(sent)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("6 HTTP/2 requests with maxRequestsPerConnection 2 used %d connections, want 3", n)
	}
	addr = srv.Listener.Addr().String()
	conns.Store(0)
	idle := w.transportsFor(connLimits{idle: 20 * time.Millisecond})
	send(idle.h1, 0)
	time.Sleep(200 * time.Millisecond)
	send(idle.h1, 0)
	if n := conns.Load(); n != 2 {
		t.Errorf("two requests 200ms apart with idleTimeout 20ms used %d connections, want 2", n)
	}
}
