package routing

import (
	"net/http/httptest"
	"net/netip"
	"testing"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestRouteRemoteNetwork: an endpoint on another network has no address
// to dial; the waypoint targets the service's address on its own network
// (dialling re-routes it through the gateway) and names the remote
// endpoint and its identity.
func TestRouteRemoteNetwork(t *testing.T) {
	s := state.NewStore()
	pt.Apply(t, s,
		pt.Pod("apps", "waypoint", "10.0.3.1", pt.ServiceAccount("waypoint")),
		pt.Pod("apps", "reviews-east", "", pt.Network("east"), pt.NetworkGateway(pt.GatewayIP("east", "172.16.0.1", 15008)),
			pt.InService(pt.ServiceKey("apps", "reviews"), 9080, 8080)),
		pt.Pod("istio-system", "ew", "172.16.0.1", pt.Network("east")),
		pt.Service("apps", "reviews", "10.96.0.12", []uint32{9080, 8080}),
	)
	rt := New(netip.MustParseAddr("10.0.3.1"), func(uint64) uint64 { return 0 }, zap.NewNop())
	req := httptest.NewRequest("GET", "http://reviews/", nil)
	res, err := rt.Route(s.Load(), netip.AddrPort{}, netip.MustParseAddrPort("10.96.0.12:9080"), nil, req, Client{Namespace: "apps"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Target.String() != "10.96.0.12:9080" || res.Via != "double-hbone" ||
		res.DstName != "reviews-east" || res.DstPrincipal != "spiffe://cluster.local/ns/apps/sa/sa-reviews-east" {
		t.Errorf("Route = target %s via %q dst %s principal %s; want the service address, double-hbone, reviews-east and its identity",
			res.Target, res.Via, res.DstName, res.DstPrincipal)
	}
}
