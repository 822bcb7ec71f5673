package routing

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// TestRouteRemoteNetworkRefused: the node proxy's decision for an endpoint
// on another network is double HBONE through its gateway; the waypoint's
// upstream does not dial that, so the request is refused with 503 rather
// than sent anywhere else.
func TestRouteRemoteNetworkRefused(t *testing.T) {
	s := state.NewStore()
	pt.Apply(t, s,
		pt.Pod("apps", "waypoint", "10.0.3.1", pt.ServiceAccount("waypoint")),
		pt.Pod("apps", "reviews-east", "", pt.Network("east"), pt.NetworkGateway(pt.GatewayIP("east", "172.16.0.1", 15008)),
			pt.InService(pt.ServiceKey("apps", "reviews"), 9080, 8080)),
		pt.Pod("istio-system", "ew", "172.16.0.1", pt.Network("east")),
		pt.Service("apps", "reviews", "10.96.0.12", []uint32{9080, 8080}),
	)
	rt := New(netip.MustParseAddr("10.0.3.1"), func(uint64) uint64 { return 0 }, zap.NewNop())
	_, err := rt.Route(s.Load(), netip.AddrPort{}, netip.MustParseAddrPort("10.96.0.12:9080"), nil,
		httptest.NewRequest("GET", "http://reviews/", nil), Client{Namespace: "apps"})
	var ref *stream.Refusal
	if !errors.As(err, &ref) || ref.Code != http.StatusServiceUnavailable || !strings.Contains(ref.Msg, "network gateways") {
		t.Fatalf("Route = %v, want a 503 naming the network gateway", err)
	}
}
