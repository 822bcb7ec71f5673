package waypoint

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/authn/authntest"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// TestAuthorizeRequestAuth: requestPrincipals and request.auth.* conditions
// (principal, audiences, presenter, claims incl. nested and list claims,
// scope split on spaces), anonymous requests, and plain TCP failing closed.
func TestAuthorizeRequestAuth(t *testing.T) {
	auth := &stream.RequestAuth{Principal: "https://idp.example/alice", Audiences: []string{"svc-a"}, Presenter: "web",
		Claims: map[string]any{"groups": []any{"eng", "ops"}, "scope": "read write", "org": map[string]any{"team": "core"}, "n": 3.0}}
	attrs := func(a *stream.RequestAuth, http bool) *Attrs {
		return &Attrs{Namespace: "demo", SrcIP: netip.MustParseAddr("10.0.0.5"), DstPort: 80, HTTP: http, Method: "GET", Path: "/", Auth: a,
			Header: func(string) (string, bool) { return "", false }}
	}
	allow := func(src *waypointapi.Source, when ...*waypointapi.Condition) []*policy {
		r := &waypointapi.Rule{When: when}
		if src != nil {
			r.From = []*waypointapi.Source{src}
		}
		return []*policy{compilePolicy(&waypointapi.Policy{Name: "p", Namespace: "demo", Rules: []*waypointapi.Rule{r}})}
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
		pols  []*policy
		a     *Attrs
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
		if v := authorize(tc.pols, tc.a); v.Allow != tc.allow {
			t.Errorf("%s: allow=%v, want %v (%s)", tc.name, v.Allow, tc.allow, v.Reason)
		}
	}
	// As DENY, what cannot be evaluated matches (fail closed).
	deny := compilePolicy(&waypointapi.Policy{Name: "d", Namespace: "demo", Action: waypointapi.Action_DENY, Rules: []*waypointapi.Rule{{
		From: []*waypointapi.Source{{RequestPrincipals: []*waypointapi.StringMatch{exact("nobody")}}}}}})
	if v := authorize([]*policy{deny}, attrs(auth, false)); v.Allow {
		t.Error("DENY on requestPrincipals over TCP allowed")
	}
	denyClaim := compilePolicy(&waypointapi.Policy{Name: "d", Namespace: "demo", Action: waypointapi.Action_DENY, Rules: []*waypointapi.Rule{{
		When: []*waypointapi.Condition{cond("request.auth.claims[]", "x")}}}})
	if v := authorize([]*policy{denyClaim}, attrs(auth, true)); v.Allow {
		t.Error("DENY with a malformed claim key allowed")
	}
}

// TestFilterOrderAuthentication: authentication runs before authorization
// and routing. Under a deny-all policy a bad token is 401 (not 403); with a
// requestPrincipals ALLOW a valid token reaches the backend, no token is
// 403, a bad token 401 with Envoy's body and a WWW-Authenticate challenge;
// an invalid token to a path no route matches is 401, not 404; a TCP port
// under the same ALLOW is refused (no JWT on plain TCP).
func TestFilterOrderAuthentication(t *testing.T) {
	rk, _, _ := authntest.NewKeys(t)
	const iss = "https://idp.example"
	authn := []*waypointapi.RequestAuthn{{Name: "jwt", Namespace: "demo", Target: "Gateway demo/waypoint",
		Rules: []*waypointapi.JwtRule{{Issuer: iss, Jwks: authntest.JWKS(t, rk)}}}}
	good, bad := authntest.Sign(t, rk, authntest.Claims(iss, "alice"), false), authntest.Sign(t, rk, authntest.Claims(iss, "alice", "exp", time.Now().Add(-time.Hour).Unix()), false)

	cfg := baseConfig(&waypointapi.Policy{Name: "deny-all", Namespace: "demo", Action: waypointapi.Action_DENY, Rules: []*waypointapi.Rule{{}}})
	cfg.Authentications = authn
	l := newLab(t, cfg)
	c := l.client(clientID, clientIP)
	if code, body := get(t, c, "/", bearer(bad)...); code != http.StatusUnauthorized || body != jwtExpired {
		t.Errorf("bad token under deny-all = %d %q, want 401 %q", code, body, jwtExpired)
	}
	if code, _ := get(t, c, "/", bearer(good)...); code != http.StatusForbidden {
		t.Errorf("good token under deny-all = %d, want 403", code)
	}

	cfg = baseConfig(&waypointapi.Policy{Name: "jwt-only", Namespace: "demo", Rules: []*waypointapi.Rule{{
		From: []*waypointapi.Source{{RequestPrincipals: []*waypointapi.StringMatch{exact(iss + "/alice")}}}}}})
	cfg.Authentications = authn
	cfg.Services[0].Routes = []*waypointapi.Route{weightedRoute()}
	l.setConfig(cfg)
	if code, body := get(t, c, "/api/x", bearer(good)...); code != http.StatusOK || !strings.HasPrefix(body, "v") {
		t.Errorf("good token = %d %q, want 200 from a backend", code, body)
	}
	if code, body := get(t, c, "/api/x"); code != http.StatusForbidden || body != DeniedBody {
		t.Errorf("no token = %d %q, want 403", code, body)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://server.demo.svc.cluster.local/api/x", nil)
	req.Header.Set("Authorization", "Bearer "+bad)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), `error="invalid_token"`) {
		t.Errorf("bad token = %d, WWW-Authenticate %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	if code, _ := get(t, c, "/nothing", bearer(bad)...); code != http.StatusUnauthorized {
		t.Errorf("bad token to an unrouted path = %d, want 401 (authentication before routing)", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if conn, err := l.tunnel(ctx, clientID, clientIP, svcVIP+":9000"); err == nil {
		conn.Close()
		t.Error("TCP port under a requestPrincipals ALLOW: tunnel accepted")
	}
}

// jwtExpired is authn's 401 body for an expired token: Envoy's jwt_authn
// message, which a client reads.
const jwtExpired = "Jwt is expired"

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
