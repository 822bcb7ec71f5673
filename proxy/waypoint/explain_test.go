package waypoint

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// TestExplainAPI: Bind, PoliciesFor and Authorize answer as the data path
// decides (zctl explain's view of a dumped config).
func TestExplainAPI(t *testing.T) {
	exact := func(v string) *waypointapi.StringMatch {
		return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Exact{Exact: v}}
	}
	cfg, err := Compile(&waypointapi.Config{
		Name: "waypoint", Namespace: "demo",
		Services: []*waypointapi.Service{{Name: "web", Namespace: "l7", Hostname: "web.l7.svc.cluster.local",
			Addresses: [][]byte{{10, 96, 0, 1}}, Ports: []*waypointapi.Port{{Port: 80, Protocol: waypointapi.Protocol_HTTP}, {Port: 9000}}}},
		Workloads: []*waypointapi.Workload{{Uid: "w1", Addresses: [][]byte{{10, 0, 0, 9}}}},
		Policies: []*waypointapi.Policy{
			{Name: "deny-admin", Namespace: "l7", Action: waypointapi.Action_DENY, Services: []string{"web.l7.svc.cluster.local"},
				Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{exact("/admin")}}}}}},
			{Name: "allow-curl", Namespace: "l7", Services: []string{"web.l7.svc.cluster.local"},
				Rules: []*waypointapi.Rule{{From: []*waypointapi.Source{{Principals: []*waypointapi.StringMatch{exact("cluster.local/ns/l7/sa/curl")}}}}}},
			{Name: "other", Namespace: "x", Services: []string{"other.x.svc.cluster.local"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := cfg.Bind(netip.MustParseAddrPort("10.96.0.1:80"))
	if err != nil || b.Service != "l7/web" || b.Protocol != waypointapi.Protocol_HTTP {
		t.Errorf("Bind VIP:80 = %+v, %v", b, err)
	}
	if _, err := cfg.Bind(netip.MustParseAddrPort("10.96.0.1:81")); err == nil || !strings.Contains(err.Error(), "not a port") {
		t.Errorf("Bind VIP:81 = %v", err)
	}
	if b, err := cfg.Bind(netip.MustParseAddrPort("10.0.0.9:8080")); err != nil || b.Service != "" || b.Protocol != waypointapi.Protocol_TCP {
		t.Errorf("Bind workload = %+v, %v", b, err)
	}
	if _, err := cfg.Bind(netip.MustParseAddrPort("10.0.0.10:80")); err == nil {
		t.Error("an unbound address was accepted")
	}
	ps := cfg.PoliciesFor("web.l7.svc.cluster.local")
	if len(ps) != 2 || ps[0].Key != "l7/deny-admin" || !ps[0].HTTP || ps[1].Key != "l7/allow-curl" || ps[1].HTTP {
		t.Errorf("PoliciesFor = %+v", ps)
	}
	a := &stream.Attrs{Principal: "cluster.local/ns/l7/sa/curl", Namespace: "l7", DstPort: 80, Service: "web.l7.svc.cluster.local", HTTP: true, Method: "GET", Path: "/admin"}
	if v := cfg.Authorize(a); v.Allow || v.Policy != "l7/deny-admin" {
		t.Errorf("GET /admin = %+v", v)
	}
	a.Path = "/"
	if v := cfg.Authorize(a); !v.Allow || v.Policy != "l7/allow-curl" {
		t.Errorf("GET / = %+v", v)
	}
}
