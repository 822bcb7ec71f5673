package state

import (
	"testing"

	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
)

// TestInboundAuthorization builds workloads and policies from xDS and decides
// connections to them the way the inbound listener will: PoliciesFor the
// destination workload, then rbac.Evaluate (docs/protocol.md#authorization-policy).
func TestInboundAuthorization(t *testing.T) {
	principal := func(p string) *securityapi.Rule {
		return &securityapi.Rule{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{
			Principals: []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Exact{Exact: p}}}}}}}}
	}
	port := func(p uint32) *securityapi.Rule {
		return &securityapi.Rule{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{DestinationPorts: []uint32{p}}}}}}
	}
	strict := &securityapi.Rule{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{{
		NotPrincipals: []*securityapi.StringMatch{{MatchType: &securityapi.StringMatch_Presence{Presence: &emptypb.Empty{}}}}}}}}}
	s := NewStore()
	mustApply(t, s,
		pod("app", "strict", "10.0.0.1", policies("istio-system/istio_converted_static_strict", "app/only-sleep")),
		pod("app", "open", "10.0.0.2"),
		pod("other", "x", "10.0.0.3"),
	)
	if err := s.ApplyAuthorizations(authzs(
		authz("istio-system", "istio_converted_static_strict", securityapi.Scope_WORKLOAD_SELECTOR, securityapi.Action_DENY, strict),
		authz("app", "only-sleep", securityapi.Scope_WORKLOAD_SELECTOR, securityapi.Action_ALLOW, principal("cluster.local/ns/app/sa/sleep")),
		authz("app", "deny-9000", securityapi.Scope_NAMESPACE, securityapi.Action_DENY, port(9000)),
		authz("istio-system", "global-deny-23", securityapi.Scope_GLOBAL, securityapi.Action_DENY, port(23)),
	), nil); err != nil {
		t.Fatal(err)
	}
	sleep := identity.MustNew("cluster.local", "app", "sleep")
	other := identity.MustNew("cluster.local", "app", "curl")
	tests := []struct {
		name    string
		dst     string
		port    uint16
		id      identity.Identity
		allowed bool
		policy  string
	}{
		{"strict: plaintext denied by the static policy", "10.0.0.1", 80, identity.Identity{}, false, "istio-system/istio_converted_static_strict"},
		{"strict: sleep allowed", "10.0.0.1", 80, sleep, true, "app/only-sleep"},
		{"strict: other principal not allowed", "10.0.0.1", 80, other, false, ""},
		{"strict: namespace DENY wins over ALLOW", "10.0.0.1", 9000, sleep, false, "app/deny-9000"},
		{"open: no ALLOW policies", "10.0.0.2", 80, identity.Identity{}, true, ""},
		{"open: namespace DENY", "10.0.0.2", 9000, other, false, "app/deny-9000"},
		{"other namespace: global DENY only", "10.0.0.3", 23, sleep, false, "istio-system/global-deny-23"},
		{"other namespace: app's namespace DENY does not apply", "10.0.0.3", 9000, sleep, true, ""},
	}
	snap := s.Load()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := snap.WorkloadByIP("", ip(tt.dst))
			d := rbac.Evaluate(snap.PoliciesFor(w), rbac.Conn{SrcIP: ip("10.9.9.9"), DstIP: ip(tt.dst), DstPort: tt.port, SrcIdentity: tt.id})
			if d.Allowed != tt.allowed || d.Policy != tt.policy {
				t.Errorf("decision = %+v, want allowed=%v policy=%q", d, tt.allowed, tt.policy)
			}
		})
	}
	// Policy change: removing the ALLOW opens "strict" to any mTLS peer.
	if err := s.ApplyAuthorizations(nil, []string{"app/only-sleep"}); err != nil {
		t.Fatal(err)
	}
	snap = s.Load()
	w := snap.WorkloadByIP("", ip("10.0.0.1"))
	if d := rbac.Evaluate(snap.PoliciesFor(w), rbac.Conn{DstIP: ip("10.0.0.1"), DstPort: 80, SrcIdentity: other}); !d.Allowed {
		t.Errorf("after removing the ALLOW: %+v", d)
	}
	allocs := testing.AllocsPerRun(100, func() {
		rbac.Evaluate(snap.PoliciesFor(w), rbac.Conn{DstIP: ip("10.0.0.1"), DstPort: 80, SrcIdentity: other})
	})
	if allocs != 0 {
		t.Errorf("PoliciesFor+Evaluate allocate %v per connection, want 0", allocs)
	}
}
