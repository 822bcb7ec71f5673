package waypoint

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// testKey is a signing key and its public JWK.
type testKey struct {
	alg  jose.SignatureAlgorithm
	priv crypto.Signer
	kid  string
}

func newTestKeys(t *testing.T) (rsaKey, ecKey, edKey testKey) {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, dk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return testKey{jose.RS256, rk, "rsa-1"}, testKey{jose.ES256, ek, "ec-1"}, testKey{jose.EdDSA, dk, "ed-1"}
}

// jwks is the public key set of keys, as a RequestAuthentication's jwks.
func jwks(t *testing.T, keys ...testKey) string {
	t.Helper()
	var set jose.JSONWebKeySet
	for _, k := range keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.priv.Public(), KeyID: k.kid, Algorithm: string(k.alg), Use: "sig"})
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sign makes a compact JWT of claims with k (kid in the header unless
// noKid).
func sign(t *testing.T, k testKey, claims map[string]any, noKid bool) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	key := jose.JSONWebKey{Key: k.priv, KeyID: k.kid}
	if noKid {
		key.KeyID = ""
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: k.alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func claims(iss, sub string, extra ...any) map[string]any {
	now := time.Now()
	c := map[string]any{"iss": iss, "sub": sub, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	for i := 0; i+1 < len(extra); i += 2 {
		c[extra[i].(string)] = extra[i+1]
	}
	return c
}

func request(t *testing.T, target string, hdr ...string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, "http://server.demo.svc.cluster.local"+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return r
}

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// TestAuthenticate: each outcome of JWT validation (RSA, ECDSA and Ed25519
// keys, with and without kid; exp and nbf with Envoy's 60 s leeway;
// audiences; unknown issuer; wrong key; malformed; the rule's locations), with
// the 401 body a client reads (Envoy's messages).
func TestAuthenticate(t *testing.T) {
	rk, ek, dk := newTestKeys(t)
	_, other, _ := newTestKeys(t)
	other.kid = ek.kid // same kid, different key: the signature must fail
	const iss = "testing@secure.istio.io"
	rule := &waypointapi.JwtRule{Issuer: iss, Jwks: jwks(t, rk, ek, dk)}
	audRule := &waypointapi.JwtRule{Issuer: "https://aud.example", Jwks: jwks(t, rk), Audiences: []string{"svc-a", "svc-b"}}
	hdrRule := &waypointapi.JwtRule{Issuer: "https://hdr.example", Jwks: jwks(t, ek),
		FromHeaders: []*waypointapi.JwtHeader{{Name: "x-jwt", Prefix: "Token "}}, FromParams: []string{"tok"}}
	uriRule := &waypointapi.JwtRule{Issuer: "https://uri.example", Error: "jwksUri is not fetched by ztunnel-go's control plane"}
	pols := compileAuthn([]*waypointapi.RequestAuthn{{Name: "jwt", Namespace: "demo", Rules: []*waypointapi.JwtRule{rule, audRule, hdrRule, uriRule}}})
	now := time.Now()
	for _, tc := range []struct {
		name      string
		req       *http.Request
		principal string // "" with wantErr "": anonymous
		wantErr   string
	}{
		{"no token: anonymous", request(t, "/"), "", ""},
		{"another scheme: anonymous", request(t, "/", "Authorization", "Basic dXNlcjpwYXNz"), "", ""},
		{"RS256", request(t, "/", bearer(sign(t, rk, claims(iss, "alice"), false))...), iss + "/alice", ""},
		{"ES256", request(t, "/", bearer(sign(t, ek, claims(iss, "bob"), false))...), iss + "/bob", ""},
		{"EdDSA without kid", request(t, "/", bearer(sign(t, dk, claims(iss, "carol"), true))...), iss + "/carol", ""},
		{"lowercase bearer", request(t, "/", "authorization", "bearer "+sign(t, rk, claims(iss, "dan"), false)), iss + "/dan", ""},
		{"access_token parameter", request(t, "/?access_token="+sign(t, rk, claims(iss, "erin"), false)), iss + "/erin", ""},
		{"expired", request(t, "/", bearer(sign(t, rk, claims(iss, "x", "exp", now.Add(-2*time.Minute).Unix()), false))...), "", errJwtExpired},
		{"expired within leeway", request(t, "/", bearer(sign(t, rk, claims(iss, "x", "exp", now.Add(-30*time.Second).Unix()), false))...), iss + "/x", ""},
		{"not yet valid", request(t, "/", bearer(sign(t, rk, claims(iss, "x", "nbf", now.Add(5*time.Minute).Unix()), false))...), "", errJwtNotYet},
		{"unknown issuer", request(t, "/", bearer(sign(t, rk, claims("https://evil.example", "x"), false))...), "", errJwtIssuer},
		{"signed by another key", request(t, "/", bearer(sign(t, other, claims(iss, "x"), false))...), "", errJwtVerify},
		{"unknown kid", request(t, "/", bearer(sign(t, testKey{rk.alg, rk.priv, "rotated"}, claims(iss, "x"), false))...), "", errJwtNoKey},
		{"malformed", request(t, "/", "Authorization", "Bearer not-a-jwt"), "", errJwtMalformed},
		{"tampered payload", request(t, "/", bearer(tamper(sign(t, rk, claims(iss, "x"), false)))...), "", errJwtVerify},
		{"audience allowed", request(t, "/", bearer(sign(t, rk, claims("https://aud.example", "x", "aud", []string{"other", "svc-b"}), false))...), "https://aud.example/x", ""},
		{"audience not allowed", request(t, "/", bearer(sign(t, rk, claims("https://aud.example", "x", "aud", "other"), false))...), "", errJwtAudience},
		{"audience missing", request(t, "/", bearer(sign(t, rk, claims("https://aud.example", "x"), false))...), "", errJwtAudience},
		{"custom header and prefix", request(t, "/", "x-jwt", "Token "+sign(t, ek, claims("https://hdr.example", "h"), false)), "https://hdr.example/h", ""},
		{"custom parameter", request(t, "/?tok="+sign(t, ek, claims("https://hdr.example", "p"), false)), "https://hdr.example/p", ""},
		{"rule without keys rejects its issuer", request(t, "/", bearer(sign(t, rk, claims("https://uri.example", "x"), false))...), "", errJwtVerify},
	} {
		auth, err := authenticate(pols, "server.demo.svc.cluster.local", tc.req, now)
		var ae *authnError
		switch {
		case tc.wantErr != "":
			if !errors.As(err, &ae) || ae.msg != tc.wantErr {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.principal == "" && auth != nil:
			t.Errorf("%s: authenticated as %q, want anonymous", tc.name, auth.Principal)
		case tc.principal != "" && (auth == nil || auth.Principal != tc.principal):
			t.Errorf("%s: %+v, want principal %q", tc.name, auth, tc.principal)
		}
	}
	if _, err := authenticate(pols, "", request(t, "/", bearer(sign(t, rk, claims("https://uri.example", "x"), false))...), now); err == nil ||
		!strings.Contains(err.Error(), "jwksUri is not fetched") {
		t.Errorf("a rule without keys: the log must say why (%v)", err)
	}
}

func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	parts[1] = strings.TrimSuffix(parts[1], parts[1][len(parts[1])-2:]) + "AA"
	return strings.Join(parts, ".")
}

// TestAuthenticateScopeAndHeaders: a RequestAuthentication for another
// service does not read this request's token; the token is removed before
// the request goes upstream unless forwardOriginalToken; claims are copied
// to headers (nested with "."), and a client's own copy of such a header
// is dropped even without a token.
func TestAuthenticateScopeAndHeaders(t *testing.T) {
	rk, _, _ := newTestKeys(t)
	const iss = "https://idp.example"
	mk := func(forward bool, services ...string) []*authnPolicy {
		return compileAuthn([]*waypointapi.RequestAuthn{{Name: "jwt", Namespace: "demo", Services: services, Rules: []*waypointapi.JwtRule{{
			Issuer: iss, Jwks: jwks(t, rk), ForwardOriginalToken: forward,
			OutputClaimToHeaders: []*waypointapi.ClaimToHeader{{Header: "x-jwt-group", Claim: "org.group"}, {Header: "x-jwt-admin", Claim: "admin"}},
		}}}})
	}
	tok := sign(t, rk, claims(iss, "alice", "org", map[string]any{"group": "eng"}, "admin", true), false)
	now := time.Now()

	r := request(t, "/", bearer("garbage")...)
	if auth, err := authenticate(mk(false, "other.demo.svc.cluster.local"), "server.demo.svc.cluster.local", r, now); auth != nil || err != nil {
		t.Errorf("policy of another service: %v %v, want anonymous", auth, err)
	}

	r = request(t, "/", append(bearer(tok), "x-jwt-group", "forged")...)
	auth, err := authenticate(mk(false), "server.demo.svc.cluster.local", r, now)
	if err != nil || auth == nil {
		t.Fatalf("valid token: %v", err)
	}
	if r.Header.Get("Authorization") != "" {
		t.Error("token forwarded upstream without forwardOriginalToken")
	}
	if g, a := r.Header.Values("x-jwt-group"), r.Header.Get("x-jwt-admin"); len(g) != 1 || g[0] != "eng" || a != "true" {
		t.Errorf("claim headers = %v %q, want [eng] true", g, a)
	}

	r = request(t, "/", append(bearer(tok), "x-jwt-group", "forged")...)
	if _, err := authenticate(mk(true), "", r, now); err != nil || r.Header.Get("Authorization") == "" {
		t.Errorf("forwardOriginalToken: token dropped (%v)", err)
	}

	r = request(t, "/", "x-jwt-group", "forged")
	if auth, err := authenticate(mk(false), "", r, now); auth != nil || err != nil || r.Header.Get("x-jwt-group") != "" {
		t.Errorf("no token: %v %v, forged header %q kept", auth, err, r.Header.Get("x-jwt-group"))
	}
}

func TestParseJWKS(t *testing.T) {
	rk, ek, _ := newTestKeys(t)
	good := jwks(t, rk, ek)
	var set map[string][]json.RawMessage
	_ = json.Unmarshal([]byte(good), &set)
	set["keys"] = append(set["keys"], json.RawMessage(`{"kty":"RSA","n":"!!","e":"AQAB"}`))
	mixed, _ := json.Marshal(set)
	if keys, err := parseJWKS(string(mixed)); err != nil || len(keys) != 2 {
		t.Errorf("a bad key beside good ones: %d keys, %v; want the 2 good ones", len(keys), err)
	}
	for _, bad := range []string{"", "{", `{"keys":[]}`, `{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`} {
		if _, err := parseJWKS(bad); err == nil {
			t.Errorf("parseJWKS(%q) accepted", bad)
		}
	}
	// A private key in the set is used by its public half only.
	b, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: ek.priv, KeyID: "p", Algorithm: "ES256"}}})
	if keys, err := parseJWKS(string(b)); err != nil || len(keys) != 1 || !keys[0].IsPublic() {
		t.Errorf("private key: %v %v", keys, err)
	}
}

// TestAuthorizeRequestAuth: requestPrincipals and request.auth.* conditions
// (principal, audiences, presenter, claims incl. nested and list claims,
// scope split on spaces), anonymous requests, and plain TCP failing closed.
func TestAuthorizeRequestAuth(t *testing.T) {
	auth := &RequestAuth{Principal: "https://idp.example/alice", Audiences: []string{"svc-a"}, Presenter: "web",
		Claims: map[string]any{"groups": []any{"eng", "ops"}, "scope": "read write", "org": map[string]any{"team": "core"}, "n": 3.0}}
	attrs := func(a *RequestAuth, http bool) *Attrs {
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
	rk, _, _ := newTestKeys(t)
	const iss = "https://idp.example"
	authn := []*waypointapi.RequestAuthn{{Name: "jwt", Namespace: "demo", Target: "Gateway demo/waypoint",
		Rules: []*waypointapi.JwtRule{{Issuer: iss, Jwks: jwks(t, rk)}}}}
	good, bad := sign(t, rk, claims(iss, "alice"), false), sign(t, rk, claims(iss, "alice", "exp", time.Now().Add(-time.Hour).Unix()), false)

	cfg := baseConfig(&waypointapi.Policy{Name: "deny-all", Namespace: "demo", Action: waypointapi.Action_DENY, Rules: []*waypointapi.Rule{{}}})
	cfg.Authentications = authn
	l := newLab(t, cfg)
	c := l.client(clientID, clientIP)
	if code, body := get(t, c, "/", bearer(bad)...); code != http.StatusUnauthorized || body != errJwtExpired {
		t.Errorf("bad token under deny-all = %d %q, want 401 %q", code, body, errJwtExpired)
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
