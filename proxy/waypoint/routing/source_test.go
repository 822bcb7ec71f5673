package routing

import (
	"net/http/httptest"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TestSourceMatch: VirtualService sourceNamespace matches the namespace of
// the client's peer identity and sourceLabels the client's proven
// workload; a client the waypoint cannot prove (no workload uid) matches
// no sourceLabels rule, even an empty selector's, and falls through to the
// next rule, never into the labelled one.
func TestSourceMatch(t *testing.T) {
	rule := func(name string, m *waypointapi.RouteMatch) *waypointapi.Route {
		if m == nil {
			m = &waypointapi.RouteMatch{}
		}
		return &waypointapi.Route{Name: name, Namespace: "shop", Kind: "VirtualService",
			Rules: []*waypointapi.RouteRule{{Matches: []*waypointapi.RouteMatch{m}, Backends: []*waypointapi.Backend{be(name)}}}}
	}
	tbl := Compile([]*waypointapi.Route{
		rule("labelled", &waypointapi.RouteMatch{SourceWorkloads: &waypointapi.SourceWorkloads{
			Labels: map[string]string{"app": "canary"}, Uids: []string{"Kubernetes//Pod/shop/canary-1"}}}),
		rule("nobody", &waypointapi.RouteMatch{SourceWorkloads: &waypointapi.SourceWorkloads{Labels: map[string]string{"app": "none"}}}),
		rule("from-team", &waypointapi.RouteMatch{SourceNamespace: "team"}),
		rule("both", &waypointapi.RouteMatch{SourceNamespace: "shop", SourceWorkloads: &waypointapi.SourceWorkloads{
			Uids: []string{"Kubernetes//Pod/team/canary-2"}}}),
		rule("rest", nil),
	})
	for _, tc := range []struct {
		client Client
		want   string
	}{
		{Client{Namespace: "shop", WorkloadUID: "Kubernetes//Pod/shop/canary-1"}, "shop/labelled"},
		{Client{Namespace: "shop"}, "shop/rest"},                                            // not proven
		{Client{Namespace: "shop", WorkloadUID: "Kubernetes//Pod/shop/web-1"}, "shop/rest"}, // other labels
		{Client{Namespace: "team", WorkloadUID: "Kubernetes//Pod/team/web-1"}, "shop/from-team"},
		{Client{Namespace: "team"}, "shop/from-team"},
		{Client{}, "shop/rest"}, // no identity: no namespace
		// A uid listed under another namespace's selector does not make a
		// client of that namespace match sourceNamespace shop.
		{Client{Namespace: "team", WorkloadUID: "Kubernetes//Pod/team/canary-2"}, "shop/from-team"},
	} {
		got, _, _ := tbl.pick(httptest.NewRequest("GET", "http://cart/", nil), tc.client, 80)
		if got == nil || got.Route() != tc.want {
			t.Errorf("client %+v: rule %v, want %s", tc.client, got, tc.want)
		}
	}
}
