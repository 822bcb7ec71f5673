package translate

import (
	"errors"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/jwks"
)

// fakeKeys answers key sets by URI or issuer; a missing one is pending.
type fakeKeys map[string]string

var errFakePending = errors.New("not fetched yet")

func (f fakeKeys) JWKS(uri string) (string, error) {
	if s, ok := f[uri]; ok {
		return s, nil
	}
	return "", errFakePending
}

func (f fakeKeys) OIDC(issuer string) (string, error) { return f.JWKS("issuer:" + issuer) }

// TestRequestAuthenticationResolvedKeys: with a JWKS resolver, a jwksUri
// rule (and a rule left to OpenID discovery) carries the fetched key set
// inline and no error; before the fetch, or when the fetched document is
// no key set, the rule rejects its issuer's tokens and the status says why.
func TestRequestAuthenticationResolvedKeys(t *testing.T) {
	const raYAML = `
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: remote, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  jwtRules:
  - issuer: testing@secure.istio.io
    jwksUri: https://raw.githubusercontent.com/istio/istio/release-1.28/security/tools/jwt/samples/jwks.json
  - issuer: https://accounts.example
`
	var objs cluster.Objects
	if errs := cluster.Decode("ra.yaml", []byte(waypointConfigYAML+raYAML), &objs); len(errs) > 0 {
		t.Fatal(errs)
	}
	objs.Sort()
	rules := func(keys JWKSResolver) ([]*waypointapi.JwtRule, PolicyStatus) {
		t.Helper()
		cfg := LocalDefaults()
		cfg.JWKS = keys
		res := Translate(cfg, &objs, nil)
		cfgs, statuses := WaypointConfigs(cfg, &objs, res)
		var st PolicyStatus
		for _, s := range statuses {
			if s.Kind == kindRA && s.Name == "demo/remote" {
				st = s
			}
		}
		for _, a := range cfgs["demo/waypoint"].GetAuthentications() {
			if a.GetName() == "remote" {
				return a.GetRules(), st
			}
		}
		t.Fatal("RequestAuthentication demo/remote not on the waypoint")
		return nil, st
	}
	uri := "https://raw.githubusercontent.com/istio/istio/release-1.28/security/tools/jwt/samples/jwks.json"

	// Pending: both rules reject, and the status says so per rule.
	rs, st := rules(fakeKeys{})
	if len(rs) != 2 || !strings.Contains(rs[0].GetError(), "not fetched yet") || !strings.Contains(rs[1].GetError(), "OpenID discovery") {
		t.Fatalf("pending: rules %v", rs)
	}
	if len(st.Invalid) != 2 || !strings.HasPrefix(st.Invalid[0], "spec.jwtRules[0].jwksUri") {
		t.Errorf("pending: status %+v", st)
	}
	// Fetched: inline keys, no errors, nothing invalid.
	rs, st = rules(fakeKeys{uri: istioSampleJWKS, "issuer:https://accounts.example": istioSampleJWKS})
	if rs[0].GetJwks() != istioSampleJWKS || rs[0].GetError() != "" || rs[1].GetJwks() != istioSampleJWKS || rs[1].GetError() != "" {
		t.Errorf("fetched: rules %v", rs)
	}
	if len(st.Invalid) != 0 || !strings.HasPrefix(st.Message, EnforcedByWaypoint) {
		t.Errorf("fetched: status %+v", st)
	}
	// A fetched document that is no key set is refused here too.
	rs, _ = rules(fakeKeys{uri: `{"keys": []}`})
	if rs[0].GetJwks() != "" || !strings.Contains(rs[0].GetError(), "no keys") {
		t.Errorf("empty key set: rule %v", rs[0])
	}
	// Without a resolver: as before, rejected and said why.
	rs, _ = rules(nil)
	if !strings.Contains(rs[0].GetError(), "no JWKS resolver") {
		t.Errorf("no resolver: rule %v", rs[0])
	}
}

// TestRequestAuthenticationRefusedKeyURI: a tenant's jwksUri that names
// http, or a link-local (cloud metadata) or loopback address, is refused by
// the control plane's resolver with its default limits; the rule rejects
// that issuer's tokens and the RequestAuthentication's status names why.
func TestRequestAuthenticationRefusedKeyURI(t *testing.T) {
	const raYAML = `
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: ssrf, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  jwtRules:
  - {issuer: a, jwksUri: "http://keys.example/jwks.json"}
  - {issuer: b, jwksUri: "https://169.254.169.254/latest/meta-data/"}
  - {issuer: c, jwksUri: "https://127.0.0.1:8443/jwks.json"}
`
	var objs cluster.Objects
	if errs := cluster.Decode("ra.yaml", []byte(waypointConfigYAML+raYAML), &objs); len(errs) > 0 {
		t.Fatal(errs)
	}
	objs.Sort()
	cfg := LocalDefaults()
	cfg.JWKS = jwks.New(jwks.Config{})
	res := Translate(cfg, &objs, nil)
	cfgs, statuses := WaypointConfigs(cfg, &objs, res)
	var st PolicyStatus
	for _, s := range statuses {
		if s.Kind == kindRA && s.Name == "demo/ssrf" {
			st = s
		}
	}
	want := []string{"only https", "link-local", "loopback"}
	if len(st.Invalid) != len(want) {
		t.Fatalf("status = %+v, want %d refusals", st, len(want))
	}
	for i, w := range want {
		if !strings.Contains(st.Invalid[i], "refused") || !strings.Contains(st.Invalid[i], w) {
			t.Errorf("status.Invalid[%d] = %q, want a refusal naming %q", i, st.Invalid[i], w)
		}
	}
	for _, a := range cfgs["demo/waypoint"].GetAuthentications() {
		if a.GetName() != "ssrf" {
			continue
		}
		for i, r := range a.GetRules() {
			if r.GetJwks() != "" || r.GetError() == "" {
				t.Errorf("rule %d = %v, want no keys and an error (tokens of its issuer rejected)", i, r)
			}
		}
	}
}
