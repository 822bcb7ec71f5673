package authz

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// TestIstioFieldSemantics: the fields Istio added or defines precisely, as
// the control plane sends them (serviceAccounts resolved to ns/sa, values
// validated), evaluated on one request each.
func TestIstioFieldSemantics(t *testing.T) {
	exact := func(v string) *waypointapi.StringMatch {
		return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Exact{Exact: v}}
	}
	req := func(principal, host string) *stream.Attrs {
		return &stream.Attrs{Principal: principal, Namespace: "demo", SrcIP: netip.MustParseAddr("10.0.0.5"),
			DstIP: netip.MustParseAddr("10.96.0.1"), DstPort: 80, HTTP: true, Host: host, Method: "GET", Path: "/"}
	}
	allow := func(r *waypointapi.Rule) *waypointapi.Policy {
		return &waypointapi.Policy{Name: "p", Namespace: "demo", Rules: []*waypointapi.Rule{r}}
	}
	deny := func(r *waypointapi.Rule) *waypointapi.Policy {
		return &waypointapi.Policy{Name: "p", Namespace: "demo", Action: waypointapi.Action_DENY, Rules: []*waypointapi.Rule{r}}
	}
	curl := "cluster.local/ns/demo/sa/curl"
	sa := func(ns, name string) []*waypointapi.ServiceAccount {
		return []*waypointapi.ServiceAccount{{Namespace: ns, Name: name}}
	}
	hosts := &waypointapi.Rule{To: []*waypointapi.Operation{{Hosts: []*waypointapi.StringMatch{exact("web.demo.svc.cluster.local")}}}}
	for _, tc := range []struct {
		name  string
		p     *waypointapi.Policy
		a     *stream.Attrs
		allow bool
	}{
		{"serviceAccounts admits the account", allow(&waypointapi.Rule{From: []*waypointapi.Source{{ServiceAccounts: sa("demo", "curl")}}}), req(curl, "web"), true},
		{"serviceAccounts in any trust domain", allow(&waypointapi.Rule{From: []*waypointapi.Source{{ServiceAccounts: sa("demo", "curl")}}}), req("other.td/ns/demo/sa/curl", "web"), true},
		{"serviceAccounts refuses another account", allow(&waypointapi.Rule{From: []*waypointapi.Source{{ServiceAccounts: sa("demo", "curl")}}}), req("cluster.local/ns/demo/sa/curl-admin", "web"), false},
		{"serviceAccounts refuses the name in another namespace", allow(&waypointapi.Rule{From: []*waypointapi.Source{{ServiceAccounts: sa("demo", "curl")}}}), req("cluster.local/ns/evil/sa/curl", "web"), false},
		{"notServiceAccounts", deny(&waypointapi.Rule{From: []*waypointapi.Source{{NotServiceAccounts: sa("demo", "curl")}}}), req("cluster.local/ns/demo/sa/x", "web"), false},
		{"trustDomains", allow(&waypointapi.Rule{From: []*waypointapi.Source{{TrustDomains: []*waypointapi.StringMatch{exact("cluster.local")}}}}), req("evil.td/ns/demo/sa/curl", "web"), false},
		{"when source.serviceAccount", allow(&waypointapi.Rule{When: []*waypointapi.Condition{{Key: "source.serviceAccount", Values: []*waypointapi.StringMatch{exact("demo/curl")}}}}), req(curl, "web"), true},
		{"DENY host with a trailing dot", deny(hosts), req(curl, "web.demo.svc.cluster.local."), false},
		{"DENY host upper case with port", deny(hosts), req(curl, "WEB.demo.svc.cluster.local:8080"), false},
		{"DENY host dot before port", deny(hosts), req(curl, "web.demo.svc.cluster.local.:80"), false},
		{"DENY host does not match another name", deny(hosts), req(curl, "web"), true},
		{"ALLOW unreadable ip value matches nothing", allow(&waypointapi.Rule{When: []*waypointapi.Condition{{Key: "source.ip", Values: []*waypointapi.StringMatch{exact("10.1.0.0/33")}}}}), req(curl, "web"), false},
		{"DENY unreadable ip value matches", deny(&waypointapi.Rule{When: []*waypointapi.Condition{{Key: "source.ip", NotValues: []*waypointapi.StringMatch{exact("nonsense")}}}}), req(curl, "web"), false},
		{"ALLOW condition without values matches nothing", allow(&waypointapi.Rule{When: []*waypointapi.Condition{{Key: "source.namespace"}}}), req(curl, "web"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Authorize([]*Policy{Compile(tc.p)}, tc.a)
			if v.Allow != tc.allow {
				t.Fatalf("allow = %v (%s), want %v", v.Allow, v.Reason, tc.allow)
			}
		})
	}
}
