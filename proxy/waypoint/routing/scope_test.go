package routing

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

func scopeRoute(ns, name, clientNs string, ports []uint32, path string, backends ...*waypointapi.Backend) *waypointapi.Route {
	r := &waypointapi.Route{Name: name, Namespace: ns, Kind: "HTTPRoute", ClientNamespace: clientNs, Ports: ports,
		Rules: []*waypointapi.RouteRule{{Backends: backends}}}
	if path != "" {
		r.Rules[0].Matches = []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_EXACT, Value: path}}}
	}
	return r
}

func be(host string) *waypointapi.Backend {
	return &waypointapi.Backend{Hostname: host, Namespace: "shop", Weight: 1}
}

// TestRouteScope: a consumer route (client_namespace) applies only to
// clients of its namespace, and replaces the producer routes for them; a
// port-scoped route only to that port; a request no route applies to goes
// to the service itself (not 404).
func TestRouteScope(t *testing.T) {
	tbl := Compile([]*waypointapi.Route{
		scopeRoute("shop", "producer", "", nil, "", be("cart-v1")),
		scopeRoute("evil", "hijack", "evil", nil, "", be("sink")),
		scopeRoute("shop", "admin", "", []uint32{8080}, "/admin", be("cart-admin")),
		scopeRoute("other", "theirs", "other", []uint32{8080}, "", be("other")),
	})
	req := func(path string) *http.Request { return httptest.NewRequest("GET", "http://cart"+path, nil) }
	for _, tc := range []struct {
		client string
		port   uint16
		path   string
		want   string // route ns/name, "" = none
		routed bool
	}{
		{"shop", 80, "/", "shop/producer", true},
		{"", 80, "/", "shop/producer", true},
		{"evil", 80, "/", "evil/hijack", true},
		{"evil", 8080, "/admin", "evil/hijack", true},
		{"shop", 8080, "/admin", "shop/admin", true},
		{"shop", 80, "/admin", "shop/producer", true},
		{"other", 80, "/", "shop/producer", true},   // its consumer route is for 8080 only
		{"other", 8080, "/x", "other/theirs", true}, // replaces the producer routes there
	} {
		got, _, routed := tbl.pick(req(tc.path), Client{Namespace: tc.client}, tc.port)
		name := ""
		if got != nil {
			name = got.Route()
		}
		if name != tc.want || routed != tc.routed {
			t.Errorf("client %q port %d %s: rule %q routed %v, want %q %v", tc.client, tc.port, tc.path, name, routed, tc.want, tc.routed)
		}
	}

	// Only a consumer route: other clients get the service itself.
	only := Compile([]*waypointapi.Route{scopeRoute("evil", "hijack", "evil", nil, "", be("sink"))})
	if r, _, routed := only.pick(req("/"), Client{Namespace: "shop"}, 80); r != nil || routed {
		t.Errorf("a shop client under evil's consumer route: rule %v routed %v, want none (the service itself)", r, routed)
	}
}

// TestRefusedBackend: a backendRef the control plane refused keeps its
// weight and its share of requests answers 500, never another backend.
func TestRefusedBackend(t *testing.T) {
	tbl := Compile([]*waypointapi.Route{scopeRoute("evil", "steal", "", nil, "",
		&waypointapi.Backend{Namespace: "shop", Weight: 1, Refused: "no ReferenceGrant"})})
	rt := New(netip.MustParseAddr("10.0.0.9"), func(n uint64) uint64 { return 0 }, zap.NewNop())
	_, err := rt.Route(nil, netip.AddrPort{}, netip.MustParseAddrPort("10.96.0.12:80"), tbl, httptest.NewRequest("GET", "http://sink/", nil), Client{Namespace: "evil"})
	var ref *stream.Refusal
	if !errors.As(err, &ref) || ref.Code != http.StatusInternalServerError {
		t.Fatalf("Route = %v, want a 500 refusal", err)
	}
}

// TestRetryKeepsTheBackend: a retry goes to the weighted backend the
// request's first attempt chose, whatever the weights would pick now, as
// Envoy's retries stay in the weighted cluster a request was routed to; a
// new request chooses by weight again. (The backends are refused ones so
// that each answer names the backend without endpoints to dial.)
func TestRetryKeepsTheBackend(t *testing.T) {
	tbl := Compile([]*waypointapi.Route{scopeRoute("shop", "split", "", nil, "",
		&waypointapi.Backend{Namespace: "shop", Weight: 90, Refused: "v1"},
		&waypointapi.Backend{Namespace: "shop", Weight: 10, Refused: "v2"})})
	var next uint64
	rt := New(netip.MustParseAddr("10.0.0.9"), func(n uint64) uint64 { return next % n }, zap.NewNop())
	dst := netip.MustParseAddrPort("10.96.0.12:80")
	req := httptest.NewRequest("GET", "http://cart/", nil)
	refused := func(err error) string {
		t.Helper()
		var ref *stream.Refusal
		if !errors.As(err, &ref) {
			t.Fatalf("routing = %v, want a refusal", err)
		}
		return ref.Msg
	}
	next = 95 // in v2's tenth
	first, err := rt.Route(nil, netip.AddrPort{}, dst, tbl, req, Client{Namespace: "shop"})
	if got := refused(err); got != "backend refused by the control plane: v2" {
		t.Fatalf("first attempt: %q, want v2's", got)
	}
	next = 0 // v1's share
	for i := range 3 {
		retry, err := rt.Retry(nil, netip.AddrPort{}, dst, tbl, req, Client{Namespace: "shop"}, first.Edit)
		if got := refused(err); got != "backend refused by the control plane: v2" {
			t.Fatalf("retry %d: %q, want the first attempt's backend v2", i+1, got)
		}
		first = retry
	}
	if _, err := rt.Route(nil, netip.AddrPort{}, dst, tbl, req, Client{Namespace: "shop"}); refused(err) != "backend refused by the control plane: v1" {
		t.Errorf("a new request: %v, want a choice by weight (v1)", err)
	}
}
