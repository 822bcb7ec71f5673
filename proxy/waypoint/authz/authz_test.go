package authz

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

func TestAuthorize(t *testing.T) {
	sm := func(kind int, v string) *waypointapi.StringMatch {
		switch kind {
		case 1:
			return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Prefix{Prefix: v}}
		case 2:
			return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Suffix{Suffix: v}}
		case 3:
			return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Presence{Presence: true}}
		}
		return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Exact{Exact: v}}
	}
	compile := func(ps ...*waypointapi.Policy) []*Policy {
		var out []*Policy
		for _, p := range ps {
			out = append(out, Compile(p))
		}
		return out
	}
	httpReq := func(method, host, path string, hdr map[string]string) *stream.Attrs {
		return &stream.Attrs{
			Principal: "cluster.local/ns/demo/sa/client", Namespace: "demo",
			SrcIP: netip.MustParseAddr("10.0.0.5"), DstIP: netip.MustParseAddr("10.96.0.1"), DstPort: 80,
			Service: "server.demo.svc.cluster.local", HTTP: true, Host: host, Method: method, Path: path,
			Header: func(n string) (string, bool) { v, ok := hdr[n]; return v, ok },
		}
	}
	hostAllow := &waypointapi.Policy{Name: "hosts", Namespace: "demo", Rules: []*waypointapi.Rule{{
		From: []*waypointapi.Source{{RemoteIpBlocks: []*waypointapi.Cidr{{Address: []byte{10, 0, 0, 0}, Length: 24}}}},
		To:   []*waypointapi.Operation{{Hosts: []*waypointapi.StringMatch{sm(2, ".demo.svc.cluster.local")}, Ports: []uint32{80}}},
		When: []*waypointapi.Condition{{Key: "source.ip", Values: []*waypointapi.StringMatch{sm(0, "10.0.0.0/16")}}, {Key: "request.headers[x-a]", Values: []*waypointapi.StringMatch{sm(3, "")}}},
	}}}
	scoped := &waypointapi.Policy{Name: "scoped", Namespace: "demo", Action: waypointapi.Action_DENY, Services: []string{"other.demo.svc.cluster.local"}, Rules: []*waypointapi.Rule{{}}}
	audit := &waypointapi.Policy{Name: "audit", Namespace: "demo", Action: waypointapi.Action_AUDIT, Rules: []*waypointapi.Rule{{}}}
	for _, tc := range []struct {
		name   string
		pols   []*Policy
		a      *stream.Attrs
		allow  bool
		policy string
	}{
		{"no policy allows", nil, httpReq("GET", "x", "/", nil), true, ""},
		{"host suffix with port, cidr, presence", compile(hostAllow), httpReq("GET", "server.demo.svc.cluster.local:80", "/", map[string]string{"x-a": "1"}), true, "demo/hosts"},
		{"header missing", compile(hostAllow), httpReq("GET", "server.demo.svc.cluster.local", "/", nil), false, ""},
		{"wrong host", compile(hostAllow), httpReq("GET", "evil.example.com", "/", map[string]string{"x-a": "1"}), false, ""},
		{"DENY scoped to another service does not apply", compile(scoped), httpReq("GET", "x", "/", nil), true, ""},
		{"AUDIT never denies", compile(audit), httpReq("GET", "x", "/", nil), true, ""},
		{"DENY before ALLOW", compile(hostAllow, &waypointapi.Policy{Name: "d", Namespace: "demo", Action: waypointapi.Action_DENY,
			Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Methods: []*waypointapi.StringMatch{sm(0, "GET")}}}}}}),
			httpReq("GET", "server.demo.svc.cluster.local", "/", map[string]string{"x-a": "1"}), false, "demo/d"},
		{"TCP: HTTP field in a DENY matches (fail closed)", compile(&waypointapi.Policy{Name: "d", Namespace: "demo", Action: waypointapi.Action_DENY,
			Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{sm(0, "/x")}}}}}}),
			&stream.Attrs{Namespace: "demo", DstPort: 9000}, false, "demo/d"},
	} {
		v := Authorize(tc.pols, tc.a)
		if v.Allow != tc.allow || v.Policy != tc.policy {
			t.Errorf("%s: %+v, want allow=%v policy=%q", tc.name, v, tc.allow, tc.policy)
		}
	}
	if v := Authorize(compile(audit), httpReq("GET", "x", "/", nil)); len(v.DryRun) != 1 || v.DryRun[0] != "demo/audit=audit" {
		t.Errorf("audit dry-run record = %v", v.DryRun)
	}
}

// TestAuthorizeRequestAuth: requestPrincipals and request.auth.* conditions
// (principal, audiences, presenter, claims incl. nested and list claims,
// scope split on spaces), anonymous requests, and plain TCP failing closed.
func TestAuthorizeRequestAuth(t *testing.T) {
	auth := &stream.RequestAuth{Principal: "https://idp.example/alice", Audiences: []string{"svc-a"}, Presenter: "web",
		Claims: map[string]any{"groups": []any{"eng", "ops"}, "scope": "read write", "org": map[string]any{"team": "core"}, "n": 3.0}}
	attrs := func(a *stream.RequestAuth, http bool) *stream.Attrs {
		return &stream.Attrs{Namespace: "demo", SrcIP: netip.MustParseAddr("10.0.0.5"), DstPort: 80, HTTP: http, Method: "GET", Path: "/", Auth: a,
			Header: func(string) (string, bool) { return "", false }}
	}
	allow := func(src *waypointapi.Source, when ...*waypointapi.Condition) []*Policy {
		r := &waypointapi.Rule{When: when}
		if src != nil {
			r.From = []*waypointapi.Source{src}
		}
		return []*Policy{Compile(&waypointapi.Policy{Name: "p", Namespace: "demo", Rules: []*waypointapi.Rule{r}})}
	}
	presence := &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Presence{Presence: true}}
	cond := func(key string, vs ...string) *waypointapi.Condition {
		c := &waypointapi.Condition{Key: key}
		for _, v := range vs {
			c.Values = append(c.Values, exact(v))
		}
		return c
	}
	for _, tc := range []struct {
		name  string
		pols  []*Policy
		a     *stream.Attrs
		allow bool
	}{
		{"requestPrincipals * with a token", allow(&waypointapi.Source{RequestPrincipals: []*waypointapi.StringMatch{presence}}), attrs(auth, true), true},
		{"requestPrincipals * anonymous", allow(&waypointapi.Source{RequestPrincipals: []*waypointapi.StringMatch{presence}}), attrs(nil, true), false},
		{"requestPrincipals prefix", allow(&waypointapi.Source{RequestPrincipals: []*waypointapi.StringMatch{prefix("https://idp.example/")}}), attrs(auth, true), true},
		{"requestPrincipals other", allow(&waypointapi.Source{RequestPrincipals: []*waypointapi.StringMatch{exact("https://idp.example/bob")}}), attrs(auth, true), false},
		{"notRequestPrincipals * anonymous", allow(&waypointapi.Source{NotRequestPrincipals: []*waypointapi.StringMatch{presence}}), attrs(nil, true), true},
		{"notRequestPrincipals * with a token", allow(&waypointapi.Source{NotRequestPrincipals: []*waypointapi.StringMatch{presence}}), attrs(auth, true), false},
		{"requestPrincipals on TCP", allow(&waypointapi.Source{RequestPrincipals: []*waypointapi.StringMatch{presence}}), attrs(auth, false), false},
		{"principal", allow(nil, cond("request.auth.principal", "https://idp.example/alice")), attrs(auth, true), true},
		{"audiences", allow(nil, cond("request.auth.audiences", "svc-b", "svc-a")), attrs(auth, true), true},
		{"presenter", allow(nil, cond("request.auth.presenter", "web")), attrs(auth, true), true},
		{"list claim", allow(nil, cond("request.auth.claims[groups]", "ops")), attrs(auth, true), true},
		{"list claim no match", allow(nil, cond("request.auth.claims[groups]", "admin")), attrs(auth, true), false},
		{"nested claim", allow(nil, cond("request.auth.claims[org][team]", "core")), attrs(auth, true), true},
		{"scope split on spaces", allow(nil, cond("request.auth.claims[scope]", "write")), attrs(auth, true), true},
		{"number claim never matches a string", allow(nil, cond("request.auth.claims[n]", "3")), attrs(auth, true), false},
		{"claim anonymous", allow(nil, cond("request.auth.claims[groups]", "ops")), attrs(nil, true), false},
		{"claim notValues", allow(nil, &waypointapi.Condition{Key: "request.auth.claims[groups]", NotValues: []*waypointapi.StringMatch{exact("ops")}}), attrs(auth, true), false},
		{"malformed claim key", allow(nil, cond("request.auth.claims[groups", "ops")), attrs(auth, true), false},
		{"claim on TCP", allow(nil, cond("request.auth.claims[groups]", "ops")), attrs(auth, false), false},
	} {
		if v := Authorize(tc.pols, tc.a); v.Allow != tc.allow {
			t.Errorf("%s: allow=%v, want %v (%s)", tc.name, v.Allow, tc.allow, v.Reason)
		}
	}
	// As DENY, what cannot be evaluated matches (fail closed).
	deny := Compile(&waypointapi.Policy{Name: "d", Namespace: "demo", Action: waypointapi.Action_DENY, Rules: []*waypointapi.Rule{{
		From: []*waypointapi.Source{{RequestPrincipals: []*waypointapi.StringMatch{exact("nobody")}}}}}})
	if v := Authorize([]*Policy{deny}, attrs(auth, false)); v.Allow {
		t.Error("DENY on requestPrincipals over TCP allowed")
	}
	denyClaim := Compile(&waypointapi.Policy{Name: "d", Namespace: "demo", Action: waypointapi.Action_DENY, Rules: []*waypointapi.Rule{{
		When: []*waypointapi.Condition{cond("request.auth.claims[]", "x")}}}})
	if v := Authorize([]*Policy{denyClaim}, attrs(auth, true)); v.Allow {
		t.Error("DENY with a malformed claim key allowed")
	}
}

func exact(s string) *waypointapi.StringMatch {
	return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Exact{Exact: s}}
}

func prefix(s string) *waypointapi.StringMatch {
	return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Prefix{Prefix: s}}
}
