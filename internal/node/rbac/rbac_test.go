package rbac

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// Proto builders: tests describe policies the way istiod sends them.

type pb = securityapi.Match

func exact(s string) *securityapi.StringMatch {
	return &securityapi.StringMatch{MatchType: &securityapi.StringMatch_Exact{Exact: s}}
}
func prefix(s string) *securityapi.StringMatch {
	return &securityapi.StringMatch{MatchType: &securityapi.StringMatch_Prefix{Prefix: s}}
}
func suffix(s string) *securityapi.StringMatch {
	return &securityapi.StringMatch{MatchType: &securityapi.StringMatch_Suffix{Suffix: s}}
}
func presence() *securityapi.StringMatch {
	return &securityapi.StringMatch{MatchType: &securityapi.StringMatch_Presence{Presence: &emptypb.Empty{}}}
}

func cidr(s string) *securityapi.Address {
	p := netip.MustParsePrefix(s)
	return &securityapi.Address{Address: p.Addr().AsSlice(), Length: uint32(p.Bits())}
}

func sa(ns, name string) *securityapi.ServiceAccountMatch {
	return &securityapi.ServiceAccountMatch{Namespace: ns, ServiceAccount: name}
}

// oneMatch is a policy with one rule, one clause, one match.
func oneMatch(action securityapi.Action, m *pb) *securityapi.Authorization {
	return &securityapi.Authorization{
		Name: "p", Namespace: "ns", Scope: securityapi.Scope_NAMESPACE, Action: action,
		Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*pb{m}}}}},
	}
}

func mustPolicy(t testing.TB, a *securityapi.Authorization) *Policy {
	t.Helper()
	p, err := FromProto(a)
	if err != nil {
		t.Fatalf("FromProto: %v", err)
	}
	return p
}

var (
	sleepID = identity.MustNew("cluster.local", "default", "sleep")
	otherID = identity.MustNew("example.org", "other", "bob")
)

// conn builds the standard test connection: 10.0.0.1 -> 10.0.1.1:8080 from sleepID.
func conn() Conn {
	return Conn{
		SrcIP:       netip.MustParseAddr("10.0.0.1"),
		DstIP:       netip.MustParseAddr("10.0.1.1"),
		DstPort:     8080,
		SrcIdentity: sleepID,
	}
}

func plaintext() Conn { c := conn(); c.SrcIdentity = identity.Identity{}; return c }
func withID(id identity.Identity) Conn {
	c := conn()
	c.SrcIdentity = id
	return c
}
func withSrc(ip string) Conn { c := conn(); c.SrcIP = netip.MustParseAddr(ip); return c }
func withDst(ip string) Conn { c := conn(); c.DstIP = netip.MustParseAddr(ip); return c }
func withPort(p uint16) Conn { c := conn(); c.DstPort = p; return c }

// TestMatch covers §5.4 field by field: each row is one Match (inside one
// rule and clause) and whether a connection matches it.
func TestMatch(t *testing.T) {
	tests := []struct {
		name  string
		match *pb
		conn  Conn
		want  bool
	}{
		{"empty match never matches", &pb{}, conn(), false},
		// Principals: spiffe:// stripped, then exact/prefix/suffix/presence.
		{"principal exact", &pb{Principals: []*securityapi.StringMatch{exact("cluster.local/ns/default/sa/sleep")}}, conn(), true},
		{"principal exact with spiffe scheme never matches", &pb{Principals: []*securityapi.StringMatch{exact("spiffe://cluster.local/ns/default/sa/sleep")}}, conn(), false},
		{"principal exact other", &pb{Principals: []*securityapi.StringMatch{exact("cluster.local/ns/default/sa/other")}}, conn(), false},
		{"principal exact is not prefix", &pb{Principals: []*securityapi.StringMatch{exact("cluster.local/ns/default/sa/sle")}}, conn(), false},
		{"principal exact longer", &pb{Principals: []*securityapi.StringMatch{exact("cluster.local/ns/default/sa/sleepy")}}, conn(), false},
		{"principal prefix across parts", &pb{Principals: []*securityapi.StringMatch{prefix("cluster.local/ns/def")}}, conn(), true},
		{"principal prefix no", &pb{Principals: []*securityapi.StringMatch{prefix("cluster.local/ns/x")}}, conn(), false},
		{"principal prefix whole", &pb{Principals: []*securityapi.StringMatch{prefix("cluster.local/ns/default/sa/sleep")}}, conn(), true},
		{"principal prefix too long", &pb{Principals: []*securityapi.StringMatch{prefix("cluster.local/ns/default/sa/sleep/x")}}, conn(), false},
		{"principal suffix across parts", &pb{Principals: []*securityapi.StringMatch{suffix("default/sa/sleep")}}, conn(), true},
		{"principal suffix whole", &pb{Principals: []*securityapi.StringMatch{suffix("cluster.local/ns/default/sa/sleep")}}, conn(), true},
		{"principal suffix too long", &pb{Principals: []*securityapi.StringMatch{suffix("xcluster.local/ns/default/sa/sleep")}}, conn(), false},
		{"principal suffix no", &pb{Principals: []*securityapi.StringMatch{suffix("/sa/bob")}}, conn(), false},
		{"principal presence", &pb{Principals: []*securityapi.StringMatch{presence()}}, conn(), true},
		{"principal presence plaintext", &pb{Principals: []*securityapi.StringMatch{presence()}}, plaintext(), false},
		{"principal exact plaintext", &pb{Principals: []*securityapi.StringMatch{exact("")}}, plaintext(), false},
		{"principals OR", &pb{Principals: []*securityapi.StringMatch{exact("a/ns/b/sa/c"), suffix("/sa/sleep")}}, conn(), true},
		{"not_principals hit", &pb{NotPrincipals: []*securityapi.StringMatch{suffix("/sa/sleep")}}, conn(), false},
		{"not_principals miss", &pb{NotPrincipals: []*securityapi.StringMatch{suffix("/sa/bob")}}, conn(), true},
		{"not_principals presence plaintext (static strict)", &pb{NotPrincipals: []*securityapi.StringMatch{presence()}}, plaintext(), true},
		{"not_principals presence mTLS", &pb{NotPrincipals: []*securityapi.StringMatch{presence()}}, conn(), false},
		// Namespaces of the peer identity.
		{"namespace exact", &pb{Namespaces: []*securityapi.StringMatch{exact("default")}}, conn(), true},
		{"namespace exact other", &pb{Namespaces: []*securityapi.StringMatch{exact("other")}}, conn(), false},
		{"namespace prefix", &pb{Namespaces: []*securityapi.StringMatch{prefix("def")}}, conn(), true},
		{"namespace suffix", &pb{Namespaces: []*securityapi.StringMatch{suffix("ault")}}, conn(), true},
		{"namespace presence plaintext", &pb{Namespaces: []*securityapi.StringMatch{presence()}}, plaintext(), false},
		{"namespace plaintext", &pb{Namespaces: []*securityapi.StringMatch{exact("default")}}, plaintext(), false},
		{"not_namespaces hit", &pb{NotNamespaces: []*securityapi.StringMatch{exact("default")}}, conn(), false},
		{"not_namespaces miss", &pb{NotNamespaces: []*securityapi.StringMatch{exact("other")}}, conn(), true},
		{"not_namespaces plaintext", &pb{NotNamespaces: []*securityapi.StringMatch{exact("default")}}, plaintext(), true},
		// Service accounts: namespace + name exact, trust domain ignored.
		{"sa hit", &pb{ServiceAccounts: []*securityapi.ServiceAccountMatch{sa("default", "sleep")}}, conn(), true},
		{"sa other td still hits", &pb{ServiceAccounts: []*securityapi.ServiceAccountMatch{sa("other", "bob")}}, withID(otherID), true},
		{"sa wrong ns", &pb{ServiceAccounts: []*securityapi.ServiceAccountMatch{sa("other", "sleep")}}, conn(), false},
		{"sa plaintext", &pb{ServiceAccounts: []*securityapi.ServiceAccountMatch{sa("default", "sleep")}}, plaintext(), false},
		{"not_sa hit", &pb{NotServiceAccounts: []*securityapi.ServiceAccountMatch{sa("default", "sleep")}}, conn(), false},
		{"not_sa miss", &pb{NotServiceAccounts: []*securityapi.ServiceAccountMatch{sa("default", "x")}}, conn(), true},
		// IPs: CIDR contains.
		{"src cidr hit", &pb{SourceIps: []*securityapi.Address{cidr("10.0.0.0/24")}}, conn(), true},
		{"src cidr miss", &pb{SourceIps: []*securityapi.Address{cidr("10.0.9.0/24")}}, conn(), false},
		{"src exact /32", &pb{SourceIps: []*securityapi.Address{cidr("10.0.0.1/32")}}, conn(), true},
		{"src /0 matches all v4", &pb{SourceIps: []*securityapi.Address{cidr("0.0.0.0/0")}}, conn(), true},
		{"src OR", &pb{SourceIps: []*securityapi.Address{cidr("192.168.0.0/16"), cidr("10.0.0.0/8")}}, conn(), true},
		{"src v4-mapped conn", &pb{SourceIps: []*securityapi.Address{cidr("10.0.0.0/24")}}, withSrc("::ffff:10.0.0.1"), true},
		{"src v6 cidr", &pb{SourceIps: []*securityapi.Address{cidr("fd00::/64")}}, withSrc("fd00::5"), true},
		{"src v6 cidr vs v4", &pb{SourceIps: []*securityapi.Address{cidr("::/0")}}, conn(), false},
		{"not_src hit", &pb{NotSourceIps: []*securityapi.Address{cidr("10.0.0.0/24")}}, conn(), false},
		{"not_src miss", &pb{NotSourceIps: []*securityapi.Address{cidr("10.9.0.0/24")}}, conn(), true},
		{"dst cidr hit", &pb{DestinationIps: []*securityapi.Address{cidr("10.0.1.0/24")}}, conn(), true},
		{"dst cidr miss", &pb{DestinationIps: []*securityapi.Address{cidr("10.0.1.0/24")}}, withDst("10.0.2.1"), false},
		{"not_dst hit", &pb{NotDestinationIps: []*securityapi.Address{cidr("10.0.1.1/32")}}, conn(), false},
		{"not_dst miss", &pb{NotDestinationIps: []*securityapi.Address{cidr("10.0.1.2/32")}}, conn(), true},
		// Ports.
		{"port hit", &pb{DestinationPorts: []uint32{80, 8080}}, conn(), true},
		{"port miss", &pb{DestinationPorts: []uint32{80}}, conn(), false},
		{"not_port hit", &pb{NotDestinationPorts: []uint32{8080}}, conn(), false},
		{"not_port miss", &pb{NotDestinationPorts: []uint32{8080}}, withPort(9090), true},
		// AND across field types.
		{"and all hold", &pb{
			Principals:       []*securityapi.StringMatch{suffix("/sa/sleep")},
			Namespaces:       []*securityapi.StringMatch{exact("default")},
			SourceIps:        []*securityapi.Address{cidr("10.0.0.0/16")},
			DestinationIps:   []*securityapi.Address{cidr("10.0.1.1/32")},
			DestinationPorts: []uint32{8080},
			ServiceAccounts:  []*securityapi.ServiceAccountMatch{sa("default", "sleep")},
		}, conn(), true},
		{"and one field fails", &pb{
			Principals:       []*securityapi.StringMatch{suffix("/sa/sleep")},
			DestinationPorts: []uint32{9090},
		}, conn(), false},
		{"and positive holds but not_ of other type hits", &pb{
			Principals:          []*securityapi.StringMatch{suffix("/sa/sleep")},
			NotDestinationPorts: []uint32{8080},
		}, conn(), false},
		{"positive and not_ of same type", &pb{
			SourceIps:    []*securityapi.Address{cidr("10.0.0.0/8")},
			NotSourceIps: []*securityapi.Address{cidr("10.0.0.0/24")},
		}, conn(), false},
		{"positive and not_ of same type carve-out miss", &pb{
			SourceIps:    []*securityapi.Address{cidr("10.0.0.0/8")},
			NotSourceIps: []*securityapi.Address{cidr("10.0.5.0/24")},
		}, conn(), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, oneMatch(securityapi.Action_ALLOW, tt.match))
			if got := p.Matches(tt.conn); got != tt.want {
				t.Errorf("Matches = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestStructure covers the rule/clause/match nesting of §5.4.
func TestStructure(t *testing.T) {
	hit := &pb{DestinationPorts: []uint32{8080}}
	miss := &pb{DestinationPorts: []uint32{1}}
	empty := &pb{}
	clause := func(ms ...*pb) *securityapi.Clause { return &securityapi.Clause{Matches: ms} }
	rule := func(cs ...*securityapi.Clause) *securityapi.Rule { return &securityapi.Rule{Clauses: cs} }
	tests := []struct {
		name  string
		rules []*securityapi.Rule
		want  bool
	}{
		{"no rules never matches", nil, false},
		{"rule with no clauses matches everything", []*securityapi.Rule{rule()}, true},
		{"clause with no matches matches", []*securityapi.Rule{rule(clause())}, true},
		{"clause with only an empty match never matches", []*securityapi.Rule{rule(clause(empty))}, false},
		{"empty match skipped, next match decides", []*securityapi.Rule{rule(clause(empty, hit))}, true},
		{"clause is OR of matches", []*securityapi.Rule{rule(clause(miss, hit))}, true},
		{"clause all miss", []*securityapi.Rule{rule(clause(miss, miss))}, false},
		{"rule is AND of clauses", []*securityapi.Rule{rule(clause(hit), clause(miss))}, false},
		{"rule AND all hold", []*securityapi.Rule{rule(clause(hit), clause(hit), clause())}, true},
		{"policy is OR of rules", []*securityapi.Rule{rule(clause(miss)), rule(clause(hit))}, true},
		{"policy all rules miss", []*securityapi.Rule{rule(clause(miss)), rule(clause(empty))}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPolicy(t, &securityapi.Authorization{Name: "p", Namespace: "ns", Rules: tt.rules})
			if got := p.Matches(conn()); got != tt.want {
				t.Errorf("Matches = %v, want %v", got, tt.want)
			}
		})
	}
}

// pol builds a named policy from a list of rule sets for evaluation tables.
func pol(name string, action securityapi.Action, dryRun bool, rules ...*securityapi.Rule) *securityapi.Authorization {
	return &securityapi.Authorization{Name: name, Namespace: "ns", Scope: securityapi.Scope_NAMESPACE,
		Action: action, DryRun: dryRun, Rules: rules}
}

var (
	matchAll  = &securityapi.Rule{} // zero clauses: matches every connection
	matchNone = &securityapi.Rule{Clauses: []*securityapi.Clause{{Matches: []*pb{{DestinationPorts: []uint32{1}}}}}}
)

const (
	allow = securityapi.Action_ALLOW
	deny  = securityapi.Action_DENY
)

// TestEvaluate covers the evaluation order of §5.3.
func TestEvaluate(t *testing.T) {
	tests := []struct {
		name     string
		policies []*securityapi.Authorization
		want     Decision
	}{
		{"no policies allows", nil,
			Decision{Allowed: true, Reason: ReasonNoAllowPolicies}},
		{"empty DENY is a no-op", []*securityapi.Authorization{pol("d", deny, false)},
			Decision{Allowed: true, Reason: ReasonNoAllowPolicies}},
		{"empty ALLOW denies everything", []*securityapi.Authorization{pol("a", allow, false)},
			Decision{Reason: ReasonNoAllowMatched}},
		{"matching DENY denies and is named", []*securityapi.Authorization{pol("d", deny, false, matchAll)},
			Decision{Policy: "ns/d", Reason: ReasonDenied}},
		{"DENY beats ALLOW", []*securityapi.Authorization{pol("a", allow, false, matchAll), pol("d", deny, false, matchAll)},
			Decision{Policy: "ns/d", Reason: ReasonDenied}},
		{"non-matching DENY, no ALLOW", []*securityapi.Authorization{pol("d", deny, false, matchNone)},
			Decision{Allowed: true, Reason: ReasonNoAllowPolicies}},
		{"matching ALLOW allows and is named", []*securityapi.Authorization{pol("a1", allow, false, matchNone), pol("a2", allow, false, matchAll)},
			Decision{Allowed: true, Policy: "ns/a2", Reason: ReasonAllowed}},
		{"ALLOWs exist none match", []*securityapi.Authorization{pol("a1", allow, false, matchNone)},
			Decision{Reason: ReasonNoAllowMatched}},
		{"dry-run DENY only reported", []*securityapi.Authorization{pol("dd", deny, true, matchAll)},
			Decision{Allowed: true, Reason: ReasonNoAllowPolicies, DryRunDeny: "ns/dd"}},
		{"dry-run DENY reported alongside enforced DENY", []*securityapi.Authorization{pol("d", deny, false, matchAll), pol("dd", deny, true, matchAll)},
			Decision{Policy: "ns/d", Reason: ReasonDenied, DryRunDeny: "ns/dd"}},
		{"non-matching dry-run DENY not reported", []*securityapi.Authorization{pol("dd", deny, true, matchNone)},
			Decision{Allowed: true, Reason: ReasonNoAllowPolicies}},
		{"dry-run ALLOW alone does not enforce", []*securityapi.Authorization{pol("da", allow, true, matchNone)},
			Decision{Allowed: true, Reason: ReasonNoAllowPolicies, DryRunAllowNoMatch: true, DryRunAllowFirst: "ns/da"}},
		{"dry-run ALLOW match reported", []*securityapi.Authorization{pol("da", allow, true, matchAll)},
			Decision{Allowed: true, Reason: ReasonNoAllowPolicies, DryRunAllow: "ns/da", DryRunAllowFirst: "ns/da"}},
		{"dry-run ALLOW with enforced ALLOW that misses", []*securityapi.Authorization{pol("da", allow, true, matchAll), pol("a", allow, false, matchNone)},
			Decision{Reason: ReasonNoAllowMatched, DryRunAllow: "ns/da", DryRunAllowFirst: "ns/da"}},
		{"dry-run ALLOW does not count as enforced ALLOW", []*securityapi.Authorization{pol("da", allow, true), pol("d", deny, false, matchNone)},
			Decision{Allowed: true, Reason: ReasonNoAllowPolicies, DryRunAllowNoMatch: true, DryRunAllowFirst: "ns/da"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ps []*Policy
			for _, a := range tt.policies {
				ps = append(ps, mustPolicy(t, a))
			}
			if got := Evaluate(ps, conn()); got != tt.want {
				t.Errorf("Evaluate =\n %+v, want\n %+v", got, tt.want)
			}
		})
	}
}

// TestStaticStrict is istiod's PeerAuthentication STRICT policy: DENY
// not_principals [presence] denies plaintext only.
func TestStaticStrict(t *testing.T) {
	p := mustPolicy(t, &securityapi.Authorization{
		Name: "istio_converted_static_strict", Namespace: "istio-system", Scope: securityapi.Scope_WORKLOAD_SELECTOR,
		Action: deny,
		Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*pb{{
			NotPrincipals: []*securityapi.StringMatch{presence()}}}}}}},
	})
	if d := Evaluate([]*Policy{p}, plaintext()); d.Allowed || d.Policy != "istio-system/istio_converted_static_strict" {
		t.Errorf("plaintext: %+v, want denied by the static policy", d)
	}
	if d := Evaluate([]*Policy{p}, conn()); !d.Allowed {
		t.Errorf("mTLS: %+v, want allowed", d)
	}
}

func TestFromProtoErrors(t *testing.T) {
	rulesWith := func(m *pb) []*securityapi.Rule {
		return []*securityapi.Rule{{}, {Clauses: []*securityapi.Clause{{}, {Matches: []*pb{{}, m}}}}}
	}
	const at = "rules[1].clauses[1].matches[1]."
	tests := []struct {
		name  string
		in    *securityapi.Authorization
		field string
	}{
		{"nil", nil, "authorization"},
		{"no name", &securityapi.Authorization{Namespace: "ns"}, "name"},
		{"no namespace", &securityapi.Authorization{Name: "n"}, "namespace"},
		{"bad scope", &securityapi.Authorization{Name: "n", Namespace: "ns", Scope: 7}, "scope"},
		{"bad action (AUDIT is not in the wire enum)", &securityapi.Authorization{Name: "n", Namespace: "ns", Action: 2}, "action"},
		{"bad ip length", &securityapi.Authorization{Name: "n", Namespace: "ns", Rules: rulesWith(&pb{
			SourceIps: []*securityapi.Address{{Address: []byte{1, 2, 3}, Length: 8}}})}, at + "source_ips[0].address"},
		{"cidr too long v4", &securityapi.Authorization{Name: "n", Namespace: "ns", Rules: rulesWith(&pb{
			NotDestinationIps: []*securityapi.Address{cidr("10.0.0.0/8"), {Address: []byte{10, 0, 0, 0}, Length: 33}}})}, at + "not_destination_ips[1].length"},
		{"cidr too long v6", &securityapi.Authorization{Name: "n", Namespace: "ns", Rules: rulesWith(&pb{
			DestinationIps: []*securityapi.Address{{Address: make([]byte, 16), Length: 129}}})}, at + "destination_ips[0].length"},
		{"port too big", &securityapi.Authorization{Name: "n", Namespace: "ns", Rules: rulesWith(&pb{
			NotDestinationPorts: []uint32{80, 70000}})}, at + "not_destination_ports[1]"},
		{"string match unset", &securityapi.Authorization{Name: "n", Namespace: "ns", Rules: rulesWith(&pb{
			NotPrincipals: []*securityapi.StringMatch{{}}})}, at + "not_principals[0]"},
		{"sa without namespace", &securityapi.Authorization{Name: "n", Namespace: "ns", Rules: rulesWith(&pb{
			ServiceAccounts: []*securityapi.ServiceAccountMatch{sa("", "x")}})}, at + "service_accounts[0].namespace"},
		{"sa without name", &securityapi.Authorization{Name: "n", Namespace: "ns", Rules: rulesWith(&pb{
			NotServiceAccounts: []*securityapi.ServiceAccountMatch{sa("x", "")}})}, at + "not_service_accounts[0].serviceAccount"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := FromProto(tt.in)
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want *FieldError", err)
			}
			if fe.Field != tt.field {
				t.Errorf("field = %q, want %q (%v)", fe.Field, tt.field, err)
			}
			if !strings.HasPrefix(err.Error(), "field "+tt.field+": ") {
				t.Errorf("message %q does not start with the field", err)
			}
		})
	}
}

func TestFromProto(t *testing.T) {
	p := mustPolicy(t, &securityapi.Authorization{
		Name: "allow-sleep", Namespace: "prod", Scope: securityapi.Scope_GLOBAL, Action: allow, DryRun: true,
		Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*pb{{
			SourceIps:       []*securityapi.Address{{Address: []byte{10, 1, 2, 3}, Length: 16}},
			DestinationIps:  []*securityapi.Address{{Address: netip.MustParseAddr("::ffff:10.9.9.9").AsSlice(), Length: 32}},
			ServiceAccounts: []*securityapi.ServiceAccountMatch{sa("prod", "web")},
		}}}}}},
	})
	if p.Key != "prod/allow-sleep" || p.Scope != ScopeGlobal || p.Action != Allow || !p.DryRun {
		t.Errorf("header = %+v", p)
	}
	m := p.Rules[0].Clauses[0].Matches[0]
	if got, want := m.SourceIPs[0], netip.MustParsePrefix("10.1.0.0/16"); got != want {
		t.Errorf("source prefix = %v, want %v (masked)", got, want)
	}
	if got, want := m.DestinationIPs[0], netip.MustParsePrefix("10.9.9.9/32"); got != want {
		t.Errorf("dest prefix = %v, want %v (unmapped)", got, want)
	}
}

// TestEvaluateNoAllocs is the hot-path budget: evaluating a warm
// policy set allocates nothing.
func TestEvaluateNoAllocs(t *testing.T) {
	ps := []*Policy{
		mustPolicy(t, pol("dd", deny, true, matchAll)),
		mustPolicy(t, oneMatch(deny, &pb{NotPrincipals: []*securityapi.StringMatch{presence()}})),
		mustPolicy(t, pol("da", allow, true, matchNone)),
		mustPolicy(t, oneMatch(allow, &pb{
			Principals:       []*securityapi.StringMatch{prefix("cluster.local/ns/x"), suffix("default/sa/sleep")},
			Namespaces:       []*securityapi.StringMatch{exact("default")},
			SourceIps:        []*securityapi.Address{cidr("10.0.0.0/8")},
			DestinationPorts: []uint32{8080},
			ServiceAccounts:  []*securityapi.ServiceAccountMatch{sa("default", "sleep")},
		})),
	}
	ps = append(ps, mustPolicy(t, audit("au", matchAll)))
	c := conn()
	var d Decision
	var v DryRunVerdict
	allocs := testing.AllocsPerRun(1000, func() { d = Evaluate(ps, c); v, _ = d.DryRun() })
	if allocs != 0 {
		t.Errorf("Evaluate allocates %v times per run, want 0", allocs)
	}
	if !d.Allowed || d.Policy != "ns/p" || d.DryRunDeny != "ns/dd" || !d.DryRunAllowNoMatch || d.Audited != "ns/au" {
		t.Errorf("decision = %+v", d)
	}
	if v.Policy != "ns/dd" || v.Allowed || !v.Differs {
		t.Errorf("dry-run verdict = %+v", v)
	}
}

func BenchmarkEvaluate(b *testing.B) {
	ps := []*Policy{
		mustPolicy(b, oneMatch(deny, &pb{NotPrincipals: []*securityapi.StringMatch{presence()}})),
		mustPolicy(b, oneMatch(allow, &pb{
			Principals:       []*securityapi.StringMatch{suffix("default/sa/sleep")},
			SourceIps:        []*securityapi.Address{cidr("10.0.0.0/8")},
			DestinationPorts: []uint32{8080},
		})),
	}
	c := conn()
	b.ReportAllocs()
	for b.Loop() {
		Evaluate(ps, c)
	}
}
