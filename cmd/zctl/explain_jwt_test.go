package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TestExplainWaypointJWT: with --jwt (and --header) explain runs the
// waypoint's own RequestAuthentication step before its authorization: a
// valid token gives the request principal a requestPrincipals ALLOW
// matches, a token signed by another key is the waypoint's 401, and no
// token is anonymous (the ALLOW does not match).
func TestExplainWaypointJWT(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	set, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: key.Public(), KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	sign := func(k *ecdsa.PrivateKey) string {
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: k, KeyID: "k1"}}, (&jose.SignerOptions{}).WithType("JWT"))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(s).Claims(jwt.Claims{Issuer: "https://issuer.example", Subject: "alice",
			Expiry: jwt.NewNumericDate(time.Now().Add(time.Hour))}).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	const reviews = "reviews.demo.svc.cluster.local"
	c := &waypointapi.Config{
		Name: "waypoint", Namespace: "demo", Identity: "spiffe://cluster.local/ns/demo/sa/sa-waypoint", Addresses: [][]byte{{10, 96, 0, 40}},
		Services: []*waypointapi.Service{{Name: "reviews", Namespace: "demo", Hostname: reviews, Addresses: [][]byte{{10, 96, 0, 50}},
			Ports: []*waypointapi.Port{{Port: 9080, Name: "http", Protocol: waypointapi.Protocol_HTTP}}}},
		Authentications: []*waypointapi.RequestAuthn{{Name: "jwt", Namespace: "demo", Services: []string{reviews},
			Rules: []*waypointapi.JwtRule{{Issuer: "https://issuer.example", Jwks: string(set)}}}},
		Policies: []*waypointapi.Policy{{Name: "require-alice", Namespace: "demo", Services: []string{reviews}, Rules: []*waypointapi.Rule{{
			From: []*waypointapi.Source{{RequestPrincipals: []*waypointapi.StringMatch{{MatchType: &waypointapi.StringMatch_Exact{Exact: "https://issuer.example/alice"}}}}},
		}}}},
	}
	raw, err := protojson.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	wd, err := parseWaypointDump("file wp", raw)
	if err != nil {
		t.Fatal(err)
	}
	d := explainDump(t)
	first := func(int) int { return 0 }
	for _, tc := range []struct {
		name, jwt, verdict, authn, authz string
	}{
		{"a valid token: its principal is allowed", sign(key), verdictAllow, "request principal https://issuer.example/alice", "ALLOW (explicitly allowed)"},
		{"another key's token: 401 before any policy", sign(other), verdictDeny, "REJECTED (401)", ""},
		{"no token: anonymous, the ALLOW does not match", "", verdictDeny, "", "DENY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr, err := parseHeaders([]string{"x-debug: 1"}, tc.jwt)
			if err != nil {
				t.Fatal(err)
			}
			e, err := explain(d, "file x", "demo/client", "10.96.0.50:9080", &request{waypoints: []*waypointDump{wd}, path: "/", header: hdr}, first)
			if err != nil {
				t.Fatal(err)
			}
			if e.Verdict != tc.verdict {
				t.Errorf("verdict %s, want %s: %+v", e.Verdict, tc.verdict, e.Steps)
			}
			if tc.authn != "" {
				if s := stepOf(t, e, "waypoint authn"); !strings.Contains(s.Result, tc.authn) {
					t.Errorf("authn step %+v, want %q", s, tc.authn)
				}
			}
			if tc.authz != "" {
				s := stepOf(t, e, "waypoint authz")
				if !strings.Contains(s.Result, tc.authz) || !strings.Contains(s.Detail, "headers") {
					t.Errorf("authz step %+v, want %q", s, tc.authz)
				}
			}
		})
	}
	if _, err := parseHeaders([]string{"no colon"}, ""); err == nil {
		t.Error("a --header without a colon was accepted")
	}
}
