package waypoint

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestRouteAllocsWithoutNewPolicy: routing a request whose backend has no
// DestinationRule, or only loadBalancer.simple, allocates what it did
// before connectionPool, consistentHash and locality existed (3 and 6,
// measured on main before them with this test).
func TestRouteAllocsWithoutNewPolicy(t *testing.T) {
	plain := &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: 1}
	simple := &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: 1,
		TrafficPolicy: &waypointapi.TrafficPolicy{LoadBalancer: waypointapi.LoadBalancer_ROUND_ROBIN}}
	for _, tc := range []struct {
		name    string
		backend *waypointapi.Backend
		want    float64
	}{{"no DestinationRule", plain, 3}, {"simple", simple, 6}} {
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
			res, err := l.w.router.Route(snap, src, dst, table, req, "demo")
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
