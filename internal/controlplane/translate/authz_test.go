package translate

import (
	"net/netip"
	"strings"
	"testing"

	securityv1beta1 "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
)

// TestInvalidFailsClosed: a mistake in a value never widens access. Each
// case translates one policy, converts it as a node proxy would, and
// decides one connection that the policy's author meant to refuse, or,
// for ALLOW, that the broken rule would have let through had its bad value
// been dropped.
func TestInvalidFailsClosed(t *testing.T) {
	client := identity.Identity{TrustDomain: "cluster.local", Namespace: "evil", ServiceAccount: "x"}
	conn := rbac.Conn{
		SrcIP: netip.MustParseAddr("10.1.2.3"), DstIP: netip.MustParseAddr("10.0.0.1"), DstPort: 22, SrcIdentity: client,
	}
	src := func(s *securityv1beta1.Source) *securityv1beta1.Rule {
		return &securityv1beta1.Rule{From: []*securityv1beta1.Rule_From{{Source: s}}}
	}
	op := func(o *securityv1beta1.Operation) *securityv1beta1.Rule {
		return &securityv1beta1.Rule{To: []*securityv1beta1.Rule_To{{Operation: o}}}
	}
	when := func(key string, vs ...string) *securityv1beta1.Rule {
		return &securityv1beta1.Rule{When: []*securityv1beta1.Condition{{Key: key, Values: vs}}}
	}
	deny, allow := securityv1beta1.AuthorizationPolicy_DENY, securityv1beta1.AuthorizationPolicy_ALLOW
	tests := []struct {
		name   string
		action securityv1beta1.AuthorizationPolicy_Action
		rule   *securityv1beta1.Rule
		field  string // the path PolicyStatus.Invalid must name
	}{
		{"deny cidr /33", deny, src(&securityv1beta1.Source{IpBlocks: []string{"10.1.0.0/33"}}), "spec.rules[0].from[0].source.ipBlocks[0]"},
		{"deny bad ip", deny, src(&securityv1beta1.Source{IpBlocks: []string{"10.1.2.300"}}), "spec.rules[0].from[0].source.ipBlocks[0]"},
		{"deny port 22a", deny, op(&securityv1beta1.Operation{Ports: []string{"22a"}}), "spec.rules[0].to[0].operation.ports[0]"},
		{"deny principal with scheme", deny, src(&securityv1beta1.Source{Principals: []string{"spiffe://cluster.local/ns/evil/sa/x"}}), "spec.rules[0].from[0].source.principals[0]"},
		{"deny namespace middle wildcard", deny, src(&securityv1beta1.Source{Namespaces: []string{"e*l"}}), "spec.rules[0].from[0].source.namespaces[0]"},
		{"deny when destination.port", deny, when("destination.port", "ssh"), "spec.rules[0].when[0].values[0]"},
		{"deny when unknown key", deny, when("source.colour", "red"), "spec.rules[0].when[0].key"},
		{"allow notIpBlocks", allow, src(&securityv1beta1.Source{NotIpBlocks: []string{"192.0.2.0/24", "10.1.0.0/40"}}), "spec.rules[0].from[0].source.notIpBlocks[1]"},
		{"allow notPorts", allow, op(&securityv1beta1.Operation{NotPorts: []string{"80", "22a"}}), "spec.rules[0].to[0].operation.notPorts[1]"},
		{"allow empty principal", allow, src(&securityv1beta1.Source{NotPrincipals: []string{""}}), "spec.rules[0].from[0].source.notPrincipals[0]"},
		{"allow service account", allow, src(&securityv1beta1.Source{NotServiceAccounts: []string{"a/"}}), "spec.rules[0].from[0].source.notServiceAccounts[0]"},
		{"unknown action", securityv1beta1.AuthorizationPolicy_Action(42), &securityv1beta1.Rule{}, "spec.action"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ap := &securityv1.AuthorizationPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "demo"},
			}
			ap.Spec.Action = tc.action
			ap.Spec.Rules = []*securityv1beta1.Rule{tc.rule}
			res := Translate(LocalDefaults(), objsWith(ap), nil)
			st := policyStatus(t, res, "demo/p")
			if !st.Sent || len(st.Invalid) != 1 || !strings.HasPrefix(st.Invalid[0], tc.field+": ") {
				t.Fatalf("status %+v, want sent with one invalid value at %s", st, tc.field)
			}
			p, err := rbac.FromProto(res.Authorizations["demo/p"])
			if err != nil {
				t.Fatal(err)
			}
			if d := rbac.Evaluate([]*rbac.Policy{p}, conn); d.Allowed {
				t.Fatalf("connection allowed (%s); an invalid value must never widen access", d.Reason)
			}
			if !strings.Contains(st.Message, "fail closed") {
				t.Errorf("message %q does not say the policy fails closed", st.Message)
			}
		})
	}
}

// TestDryRunAndAudit: the annotation and AUDIT both go out with dry_run;
// AUDIT carries the audit marker and the DENY action.
func TestDryRunAndAudit(t *testing.T) {
	mk := func(name string, action securityv1beta1.AuthorizationPolicy_Action, ann map[string]string) *securityv1.AuthorizationPolicy {
		ap := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "demo", Annotations: ann}}
		ap.Spec.Action = action
		ap.Spec.Rules = []*securityv1beta1.Rule{{}}
		return ap
	}
	res := Translate(LocalDefaults(), objsWith(
		mk("dry", securityv1beta1.AuthorizationPolicy_ALLOW, map[string]string{AnnotationDryRun: "true"}),
		mk("not-dry", securityv1beta1.AuthorizationPolicy_DENY, map[string]string{AnnotationDryRun: "false"}),
		mk("audit", securityv1beta1.AuthorizationPolicy_AUDIT, nil),
	), nil)
	if a := res.Authorizations["demo/dry"]; !a.GetDryRun() || a.GetAction() != securityapi.Action_ALLOW {
		t.Errorf("dry: %v", a)
	}
	if a := res.Authorizations["demo/not-dry"]; a.GetDryRun() {
		t.Errorf("not-dry: %v", a)
	}
	a := res.Authorizations["demo/audit"]
	if !a.GetDryRun() || a.GetAction() != securityapi.Action_DENY || len(a.GetExtensions()) != 1 || a.GetExtensions()[0].GetName() != securityapi.AuditExtension {
		t.Errorf("audit: %v", a)
	}
	if st := policyStatus(t, res, "demo/audit"); !st.DryRun || !st.Sent {
		t.Errorf("audit status %+v", st)
	}
}

func policyStatus(t *testing.T, r *Result, name string) PolicyStatus {
	t.Helper()
	for _, s := range r.Policies {
		if s.Kind == kindAP && s.Name == name {
			return s
		}
	}
	t.Fatalf("no status for %s in %+v", name, r.Policies)
	return PolicyStatus{}
}

func objsWith(aps ...*securityv1.AuthorizationPolicy) *cluster.Objects {
	return &cluster.Objects{AuthorizationPolicies: aps}
}
