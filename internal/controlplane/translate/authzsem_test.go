package translate

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	securityv1beta1 "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
)

// TestRootNamespaceSelectorPolicy: an AuthorizationPolicy with a selector in
// the root namespace selects matching workloads in every namespace, as
// istiod attaches it (a mesh-wide DENY by label); a selector policy in any
// other namespace stays in its namespace.
func TestRootNamespaceSelectorPolicy(t *testing.T) {
	const objsYAML = `
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Namespace
metadata: {name: other, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: demo, labels: {app: web}}
spec: {nodeName: node0, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: demo, labels: {app: db}}
spec: {nodeName: node0, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: 10.0.0.2}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: other, labels: {app: web}}
spec: {nodeName: node0, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: 10.0.0.3}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-web, namespace: %ROOT%}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web-only-here, namespace: demo}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{from: [{source: {namespaces: [x]}}]}]
`
	for _, root := range []string{"", "mesh-root"} {
		cfg := Config{RootNamespace: root}.withDefaults()
		var objs cluster.Objects
		y := []byte(strings.ReplaceAll(objsYAML, "%ROOT%", cfg.RootNamespace))
		if errs := cluster.Decode("root.yaml", y, &objs); len(errs) > 0 {
			t.Fatalf("decode: %v", errs)
		}
		objs.Sort()
		res := Translate(cfg, &objs, nil)
		got := map[string][]string{}
		for _, a := range res.Addresses.All() {
			if w := a.GetWorkload(); w != nil {
				got[w.GetNamespace()+"/"+w.GetName()] = w.GetAuthorizationPolicies()
			}
		}
		rootPol := cfg.RootNamespace + "/deny-web"
		for wl, want := range map[string][]string{
			"demo/web":  {"demo/web-only-here", rootPol},
			"other/web": {rootPol},
			"demo/db":   nil,
		} {
			var pols []string
			for _, p := range got[wl] {
				if p == rootPol || p == "demo/web-only-here" {
					pols = append(pols, p)
				}
			}
			slices.Sort(pols)
			slices.Sort(want)
			if !slices.Equal(pols, want) {
				t.Errorf("root %q: %s policies %v, want %v", cfg.RootNamespace, wl, got[wl], want)
			}
		}
		tr := newTranslator(cfg, &objs, nil)
		tr.translateAuthorizationPolicies()
		if p := tr.policiesFor("other", map[string]string{"app": "web"}); !slices.Equal(p, []string{rootPol}) {
			t.Errorf("root %q: policiesFor(other, app=web) = %v", cfg.RootNamespace, p)
		}
	}
}

// TestNodeL4Semantics: node-proxy conversion of the L4 subset as Istio
// defines it. Every `when` entry must hold (AND, not OR), and a DENY rule is
// enforced without the L7 attributes node proxies cannot see, so it matches
// more connections (as istiod sends it to ztunnel), never fewer.
func TestNodeL4Semantics(t *testing.T) {
	client := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "curl"}
	conn := rbac.Conn{SrcIP: netip.MustParseAddr("10.1.2.3"), DstIP: netip.MustParseAddr("10.0.0.1"), DstPort: 8080, SrcIdentity: client}
	allow, deny := securityv1beta1.AuthorizationPolicy_ALLOW, securityv1beta1.AuthorizationPolicy_DENY
	cond := func(k string, vs ...string) *securityv1beta1.Condition {
		return &securityv1beta1.Condition{Key: k, Values: vs}
	}
	tests := []struct {
		name    string
		action  securityv1beta1.AuthorizationPolicy_Action
		rule    *securityv1beta1.Rule
		allowed bool
	}{
		{"allow: every when must hold", allow, &securityv1beta1.Rule{When: []*securityv1beta1.Condition{
			cond("source.namespace", "demo"), cond("source.ip", "10.9.0.0/16")}}, false},
		{"allow: both when hold", allow, &securityv1beta1.Rule{When: []*securityv1beta1.Condition{
			cond("source.namespace", "demo"), cond("source.ip", "10.1.0.0/16")}}, true},
		{"allow: serviceAccounts of the policy namespace", allow, &securityv1beta1.Rule{From: []*securityv1beta1.Rule_From{
			{Source: &securityv1beta1.Source{ServiceAccounts: []string{"curl"}}}}}, true},
		{"allow: serviceAccounts of another account", allow, &securityv1beta1.Rule{From: []*securityv1beta1.Rule_From{
			{Source: &securityv1beta1.Source{ServiceAccounts: []string{"demo/other"}}}}}, false},
		{"deny: L7-only operation denies every connection", deny, &securityv1beta1.Rule{To: []*securityv1beta1.Rule_To{
			{Operation: &securityv1beta1.Operation{Methods: []string{"POST"}}}}}, false},
		{"deny: L7 when is dropped, the L4 part still decides", deny, &securityv1beta1.Rule{
			From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{Namespaces: []string{"other"}}}},
			When: []*securityv1beta1.Condition{cond("request.headers[x-user]", "bob")}}, true},
		{"deny: remoteIpBlocks source matches everyone", deny, &securityv1beta1.Rule{From: []*securityv1beta1.Rule_From{
			{Source: &securityv1beta1.Source{RemoteIpBlocks: []string{"192.0.2.1"}}}}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ap := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "demo"}}
			ap.Spec.Action = tc.action
			ap.Spec.Rules = []*securityv1beta1.Rule{tc.rule}
			res := Translate(LocalDefaults(), objsWith(ap), nil)
			p, err := rbac.FromProto(res.Authorizations["demo/p"])
			if err != nil {
				t.Fatal(err)
			}
			if d := rbac.Evaluate([]*rbac.Policy{p}, conn); d.Allowed != tc.allowed {
				t.Fatalf("allowed = %v (%s), want %v; status %+v", d.Allowed, d.Reason, tc.allowed, policyStatus(t, res, "demo/p"))
			}
		})
	}
}
