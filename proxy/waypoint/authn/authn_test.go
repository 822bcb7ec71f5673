package authn

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/authn/authntest"
)

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
	rk, ek, dk := authntest.NewKeys(t)
	_, other, _ := authntest.NewKeys(t)
	other.Kid = ek.Kid // same kid, different key: the signature must fail
	const iss = "testing@secure.istio.io"
	rule := &waypointapi.JwtRule{Issuer: iss, Jwks: authntest.JWKS(t, rk, ek, dk)}
	audRule := &waypointapi.JwtRule{Issuer: "https://aud.example", Jwks: authntest.JWKS(t, rk), Audiences: []string{"svc-a", "svc-b"}}
	hdrRule := &waypointapi.JwtRule{Issuer: "https://hdr.example", Jwks: authntest.JWKS(t, ek),
		FromHeaders: []*waypointapi.JwtHeader{{Name: "x-jwt", Prefix: "Token "}}, FromParams: []string{"tok"}}
	uriRule := &waypointapi.JwtRule{Issuer: "https://uri.example", Error: "jwksUri is not fetched by ztunnel-go's control plane"}
	pols := Compile([]*waypointapi.RequestAuthn{{Name: "jwt", Namespace: "demo", Rules: []*waypointapi.JwtRule{rule, audRule, hdrRule, uriRule}}})
	now := time.Now()
	for _, tc := range []struct {
		name      string
		req       *http.Request
		principal string // "" with wantErr "": anonymous
		wantErr   string
	}{
		{"no token: anonymous", request(t, "/"), "", ""},
		{"another scheme: anonymous", request(t, "/", "Authorization", "Basic dXNlcjpwYXNz"), "", ""},
		{"RS256", request(t, "/", bearer(authntest.Sign(t, rk, authntest.Claims(iss, "alice"), false))...), iss + "/alice", ""},
		{"ES256", request(t, "/", bearer(authntest.Sign(t, ek, authntest.Claims(iss, "bob"), false))...), iss + "/bob", ""},
		{"EdDSA without kid", request(t, "/", bearer(authntest.Sign(t, dk, authntest.Claims(iss, "carol"), true))...), iss + "/carol", ""},
		{"lowercase bearer", request(t, "/", "authorization", "bearer "+authntest.Sign(t, rk, authntest.Claims(iss, "dan"), false)), iss + "/dan", ""},
		{"access_token parameter", request(t, "/?access_token="+authntest.Sign(t, rk, authntest.Claims(iss, "erin"), false)), iss + "/erin", ""},
		{"expired", request(t, "/", bearer(authntest.Sign(t, rk, authntest.Claims(iss, "x", "exp", now.Add(-2*time.Minute).Unix()), false))...), "", errJwtExpired},
		{"expired within leeway", request(t, "/", bearer(authntest.Sign(t, rk, authntest.Claims(iss, "x", "exp", now.Add(-30*time.Second).Unix()), false))...), iss + "/x", ""},
		{"not yet valid", request(t, "/", bearer(authntest.Sign(t, rk, authntest.Claims(iss, "x", "nbf", now.Add(5*time.Minute).Unix()), false))...), "", errJwtNotYet},
		{"unknown issuer", request(t, "/", bearer(authntest.Sign(t, rk, authntest.Claims("https://evil.example", "x"), false))...), "", errJwtIssuer},
		{"signed by another key", request(t, "/", bearer(authntest.Sign(t, other, authntest.Claims(iss, "x"), false))...), "", errJwtVerify},
		{"unknown kid", request(t, "/", bearer(authntest.Sign(t, authntest.Key{Alg: rk.Alg, Priv: rk.Priv, Kid: "rotated"}, authntest.Claims(iss, "x"), false))...), "", errJwtNoKey},
		{"malformed", request(t, "/", "Authorization", "Bearer not-a-jwt"), "", errJwtMalformed},
		{"tampered payload", request(t, "/", bearer(tamper(authntest.Sign(t, rk, authntest.Claims(iss, "x"), false)))...), "", errJwtVerify},
		{"audience allowed", request(t, "/", bearer(authntest.Sign(t, rk, authntest.Claims("https://aud.example", "x", "aud", []string{"other", "svc-b"}), false))...), "https://aud.example/x", ""},
		{"audience not allowed", request(t, "/", bearer(authntest.Sign(t, rk, authntest.Claims("https://aud.example", "x", "aud", "other"), false))...), "", errJwtAudience},
		{"audience missing", request(t, "/", bearer(authntest.Sign(t, rk, authntest.Claims("https://aud.example", "x"), false))...), "", errJwtAudience},
		{"custom header and prefix", request(t, "/", "x-jwt", "Token "+authntest.Sign(t, ek, authntest.Claims("https://hdr.example", "h"), false)), "https://hdr.example/h", ""},
		{"custom parameter", request(t, "/?tok="+authntest.Sign(t, ek, authntest.Claims("https://hdr.example", "p"), false)), "https://hdr.example/p", ""},
		{"rule without keys rejects its issuer", request(t, "/", bearer(authntest.Sign(t, rk, authntest.Claims("https://uri.example", "x"), false))...), "", errJwtVerify},
	} {
		auth, err := Authenticate(pols, "server.demo.svc.cluster.local", tc.req, now)
		var ae *Error
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
	if _, err := Authenticate(pols, "", request(t, "/", bearer(authntest.Sign(t, rk, authntest.Claims("https://uri.example", "x"), false))...), now); err == nil ||
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
	rk, _, _ := authntest.NewKeys(t)
	const iss = "https://idp.example"
	mk := func(forward bool, services ...string) []*Policy {
		return Compile([]*waypointapi.RequestAuthn{{Name: "jwt", Namespace: "demo", Services: services, Rules: []*waypointapi.JwtRule{{
			Issuer: iss, Jwks: authntest.JWKS(t, rk), ForwardOriginalToken: forward,
			OutputClaimToHeaders: []*waypointapi.ClaimToHeader{{Header: "x-jwt-group", Claim: "org.group"}, {Header: "x-jwt-admin", Claim: "admin"}},
		}}}})
	}
	tok := authntest.Sign(t, rk, authntest.Claims(iss, "alice", "org", map[string]any{"group": "eng"}, "admin", true), false)
	now := time.Now()

	r := request(t, "/", bearer("garbage")...)
	if auth, err := Authenticate(mk(false, "other.demo.svc.cluster.local"), "server.demo.svc.cluster.local", r, now); auth != nil || err != nil {
		t.Errorf("policy of another service: %v %v, want anonymous", auth, err)
	}

	r = request(t, "/", append(bearer(tok), "x-jwt-group", "forged")...)
	auth, err := Authenticate(mk(false), "server.demo.svc.cluster.local", r, now)
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
	if _, err := Authenticate(mk(true), "", r, now); err != nil || r.Header.Get("Authorization") == "" {
		t.Errorf("forwardOriginalToken: token dropped (%v)", err)
	}

	r = request(t, "/", "x-jwt-group", "forged")
	if auth, err := Authenticate(mk(false), "", r, now); auth != nil || err != nil || r.Header.Get("x-jwt-group") != "" {
		t.Errorf("no token: %v %v, forged header %q kept", auth, err, r.Header.Get("x-jwt-group"))
	}
}

func TestParseJWKS(t *testing.T) {
	rk, ek, _ := authntest.NewKeys(t)
	good := authntest.JWKS(t, rk, ek)
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
	b, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: ek.Priv, KeyID: "p", Algorithm: "ES256"}}})
	if keys, err := parseJWKS(string(b)); err != nil || len(keys) != 1 || !keys[0].IsPublic() {
		t.Errorf("private key: %v %v", keys, err)
	}
}
