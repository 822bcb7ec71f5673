package translate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// istioSampleJWKS is Istio's demo key set (istio/istio
// security/tools/jwt/samples/jwks.json, the key of its demo.jwt, used by
// Istio's "JWT authentication" task), inline as jwks.
const istioSampleJWKS = `{ "keys":[ {"e":"AQAB","kid":"DHFbpoIUqrY8t2zpA2qXfCmr5VO5ZEr4RzHU_-envvQ","kty":"RSA","n":"xAE7eB6qugXyCAG3yhh7pkDkT65pHymX-P7KfIupjf59vsdo91bSP9C8H07pSAGQO1MV_xFj9VswgsCg4R6otmg5PV2He95lZdHtOcU5DXIg_pbhLdKXbi66GlVeK6ABZOUW3WYtnNHD-91gVuoeJT_DwtGGcp4ignkgXfkiEm4sw-4sfb4qdt5oLbyVpmW6x9cfa7vs2WTfURiCrBoUqgBo_-4WTiULmmHSGZHOjzwa8WtrtOQGsAFjIbno85jp6MnGGGZPYZbDAa_b3y5u-YpW7ypZrvD8BgtKVjgtQgZhLAGezMt0ua3DRrWnKqTZ0BJ_EyxOGuHJrLsn00fnMQ"}]}`

// requestAuthnYAML follows Istio's JWT task (RequestAuthentication
// "jwt-example" for issuer testing@secure.istio.io, an AuthorizationPolicy
// requiring requestPrincipals testing@secure.istio.io/testing@secure.istio.io
// and a groups claim) with targetRefs for a waypoint, plus the forms that
// cannot be enforced.
const requestAuthnYAML = `
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt-example, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  jwtRules:
  - issuer: testing@secure.istio.io
    jwks: '` + istioSampleJWKS + `'
    audiences: [app.example]
    fromHeaders: [{name: x-jwt, prefix: "Token "}]
    fromParams: [tok]
    forwardOriginalToken: true
    outputClaimToHeaders: [{header: x-jwt-foo, claim: foo}]
---
apiVersion: security.istio.io/v1beta1
kind: RequestAuthentication
metadata: {name: svc-uri, namespace: demo}
spec:
  targetRefs: [{kind: Service, group: "", name: server}]
  jwtRules:
  - issuer: https://accounts.example
    jwksUri: https://accounts.example/.well-known/jwks.json
  - issuer: https://bad.example
    jwks: '{"keys": "nope"}'
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: mesh-required, namespace: istio-system}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: GatewayClass, name: istio-waypoint}]
  jwtRules:
  - issuer: https://corp.example
    jwks: '` + istioSampleJWKS + `'
    presence: REQUIRED
    fromCookies: [session]
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: class-from-app-ns, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: GatewayClass, name: istio-waypoint}]
  jwtRules: [{issuer: x, jwks: '` + istioSampleJWKS + `'}]
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: by-selector, namespace: demo}
spec:
  selector: {matchLabels: {app: server}}
  jwtRules: [{issuer: x, jwks: '` + istioSampleJWKS + `'}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: require-jwt, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  rules:
  - from: [{source: {requestPrincipals: ["testing@secure.istio.io/testing@secure.istio.io"]}}]
    when:
    - {key: "request.auth.claims[groups]", values: [group1]}
    - {key: "request.auth.claims[org][team]", values: [core]}
    - {key: request.auth.audiences, values: [app.example]}
    - {key: request.auth.presenter, notValues: [evil]}
    - {key: request.auth.principal, values: ["testing@secure.istio.io/*"]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: node-jwt, namespace: demo}
spec:
  selector: {matchLabels: {app: server}}
  rules:
  - from: [{source: {requestPrincipals: ["*"]}}]
`

// TestWaypointRequestAuthentication: RequestAuthentications attach to a
// waypoint by targetRefs as AuthorizationPolicies do (Gateway, GatewayClass
// from the root namespace, bound Service) and carry their rules; what the
// waypoint cannot do fails closed and is in the status; AuthorizationPolicy
// requestPrincipals and request.auth.* are translated for the waypoint
// while a node-proxy policy using them still drops its rule.
func TestWaypointRequestAuthentication(t *testing.T) {
	var objs cluster.Objects
	if errs := cluster.Decode("requestauthn.yaml", []byte(waypointConfigYAML+requestAuthnYAML), &objs); len(errs) > 0 {
		t.Fatalf("decode: %v", errs)
	}
	objs.Sort()
	if len(objs.RequestAuthentications) != 5 || len(objs.Ignored) != 0 {
		t.Fatalf("%d RequestAuthentications, ignored %v: v1 and v1beta1 must both be read", len(objs.RequestAuthentications), objs.Ignored)
	}
	res := Translate(LocalDefaults(), &objs, nil)
	cfgs, statuses := WaypointConfigs(LocalDefaults(), &objs, res)
	wp := cfgs["demo/waypoint"]
	authns := map[string]*waypointapi.RequestAuthn{}
	for _, a := range wp.GetAuthentications() {
		authns[a.GetNamespace()+"/"+a.GetName()] = a
	}
	if len(authns) != 3 {
		t.Fatalf("waypoint authentications = %v, want jwt-example, svc-uri, mesh-required", authns)
	}
	ex := authns["demo/jwt-example"]
	r := ex.GetRules()[0]
	if ex.GetTarget() != "Gateway demo/waypoint" || len(ex.GetServices()) != 0 || r.GetIssuer() != "testing@secure.istio.io" ||
		r.GetJwks() != istioSampleJWKS || r.GetAudiences()[0] != "app.example" || r.GetFromHeaders()[0].GetPrefix() != "Token " ||
		r.GetFromParams()[0] != "tok" || !r.GetForwardOriginalToken() || r.GetOutputClaimToHeaders()[0].GetClaim() != "foo" || r.GetError() != "" {
		t.Errorf("jwt-example = %v", ex)
	}
	uri := authns["demo/svc-uri"]
	if len(uri.GetServices()) != 1 || uri.GetServices()[0] != "server.demo.svc.cluster.local" || uri.GetTarget() != "Service demo/server" {
		t.Errorf("svc-uri scope = %v %q", uri.GetServices(), uri.GetTarget())
	}
	if e := uri.GetRules()[0].GetError(); !strings.Contains(e, "jwksUri") {
		t.Errorf("jwksUri rule error = %q, want it rejected", e)
	}
	if e := uri.GetRules()[1].GetError(); !strings.Contains(e, "not a JSON Web Key Set") {
		t.Errorf("bad jwks rule error = %q", e)
	}
	// The cookie-only rule would otherwise read the default locations.
	if e := authns["istio-system/mesh-required"].GetRules()[0].GetError(); !strings.Contains(e, "cookies") {
		t.Errorf("cookie-only rule error = %q", e)
	}
	// presence REQUIRED: a DENY for requests without that issuer's token,
	// on every waypoint (GatewayClass).
	for _, key := range []string{"demo/waypoint", "demo/idle"} {
		var req *waypointapi.Policy
		for _, p := range cfgs[key].GetPolicies() {
			if p.GetName() == "mesh-required"+requiredPolicySuffix {
				req = p
			}
		}
		if req == nil || req.GetAction() != waypointapi.Action_DENY ||
			req.GetRules()[0].GetFrom()[0].GetNotRequestPrincipals()[0].GetPrefix() != "https://corp.example/" {
			t.Errorf("%s: REQUIRED policy = %v", key, req)
		}
	}
	if n := len(cfgs["demo/idle"].GetAuthentications()); n != 1 {
		t.Errorf("idle waypoint has %d authentications, want the class one only", n)
	}

	var pol *waypointapi.Policy
	for _, p := range wp.GetPolicies() {
		if p.GetName() == "require-jwt" {
			pol = p
		}
	}
	rule := pol.GetRules()[0]
	if rule.GetFrom()[0].GetRequestPrincipals()[0].GetExact() != "testing@secure.istio.io/testing@secure.istio.io" || len(rule.GetWhen()) != 5 ||
		rule.GetWhen()[1].GetKey() != "request.auth.claims[org][team]" || rule.GetWhen()[4].GetValues()[0].GetPrefix() != "testing@secure.istio.io/" {
		t.Errorf("require-jwt = %v", pol)
	}

	st := map[string]PolicyStatus{}
	for _, s := range statuses {
		st[s.Kind+" "+s.Name] = s
	}
	for name, want := range map[string]struct {
		msg     string
		invalid []string // substrings, one per Invalid entry
	}{
		"demo/jwt-example":           {EnforcedByWaypoint + "demo/waypoint ", nil},
		"demo/svc-uri":               {EnforcedByWaypoint + "demo/waypoint ", []string{"jwksUri", "not a JSON Web Key Set"}},
		"istio-system/mesh-required": {EnforcedByWaypoint + "demo/idle, demo/waypoint ", []string{"cookies", "REQUIRED"}},
		"demo/class-from-app-ns":     {"not enforced: its targetRefs", nil},
		"demo/by-selector":           {"not enforced: node proxies cannot validate JWTs", nil},
	} {
		s, ok := st[kindRA+" "+name]
		if !ok || !strings.HasPrefix(s.Message, want.msg) || s.Sent || len(s.Invalid) != len(want.invalid) {
			t.Errorf("%s status = %+v, want %q and %d invalid", name, s, want.msg, len(want.invalid))
			continue
		}
		for i, sub := range want.invalid {
			if !strings.Contains(s.Invalid[i], sub) || !strings.HasPrefix(s.Invalid[i], "spec.jwtRules[") {
				t.Errorf("%s invalid[%d] = %q, want %q", name, i, s.Invalid[i], sub)
			}
		}
	}
	if s := st[kindAP+" demo/require-jwt"]; len(s.Invalid) != 0 || !strings.HasPrefix(s.Message, EnforcedByWaypoint) {
		t.Errorf("require-jwt status = %+v", s)
	}
	// Node proxies cannot match a request principal: still fail closed.
	if s := st[kindAP+" demo/node-jwt"]; !s.Sent || !strings.Contains(s.Message, "requestPrincipals") {
		t.Errorf("node-jwt status = %+v, want its rule dropped", s)
	}
	if a := res.Authorizations["demo/node-jwt"]; a == nil || len(a.GetRules()) != 0 {
		t.Errorf("node-jwt authorization = %v, want no rules (denies all it selects)", a)
	}
}

// TestRequestAuthenticationChange: a RequestAuthentication change
// re-translates the global unit (Changes.Global, so waypoint configs are
// rebuilt) and its status follows.
func TestRequestAuthenticationChange(t *testing.T) {
	objs := waypointObjects(t)
	tr := NewTranslator(LocalDefaults())
	tr.Update(objs, nil)
	var withRA cluster.Objects
	if errs := cluster.Decode("ra.yaml", []byte(waypointConfigYAML+requestAuthnYAML), &withRA); len(errs) > 0 {
		t.Fatal(errs)
	}
	withRA.Sort()
	next := *objs
	next.RequestAuthentications = withRA.RequestAuthentications
	res, ch := tr.Update(&next, nil)
	if ch.Full || !ch.Global || ch.Reason != "RequestAuthentication changed" {
		t.Errorf("changes = full %v global %v %q", ch.Full, ch.Global, ch.Reason)
	}
	n := 0
	for _, s := range res.Policies {
		if s.Kind == kindRA {
			n++
		}
	}
	if n != 5 {
		t.Errorf("%d RequestAuthentication statuses, want 5", n)
	}
}

// TestIstioRequestAuthentications decodes the RequestAuthentications of
// Istio's CRD validation suite and validation dataset (v1 and v1beta1,
// every field: cookies, payload header, timeout, spaceDelimitedClaims),
// bound to a waypoint through a Service: each decodes, gets a status, and
// what the waypoint cannot do is named per field (fail closed), never
// dropped silently. ZTG_ISTIO_SRC names the Istio tree; without it the test
// skips.
func TestIstioRequestAuthentications(t *testing.T) {
	root := os.Getenv("ZTG_ISTIO_SRC")
	if root == "" {
		t.Skip("ZTG_ISTIO_SRC is not set (path of an istio/istio source tree)")
	}
	n := 0
	for _, f := range []string{
		"pkg/config/validation/testdata/crds/reqauth-valid.yaml",
		"pkg/test/datasets/validation/dataset/security-v1-RequestAuthentication.yaml",
		"pkg/test/datasets/validation/dataset/security-v1beta1-RequestAuthentication.yaml",
	} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		var objs cluster.Objects
		if errs := cluster.Decode("waypointconfig.yaml", []byte(waypointConfigYAML), &objs); len(errs) > 0 {
			t.Fatal(errs)
		}
		before := len(objs.RequestAuthentications)
		for _, e := range cluster.Decode(f, data, &objs) {
			t.Errorf("%s: %v", f, e)
		}
		// Into the waypoint's namespace, on its bound Service "server".
		for _, ra := range objs.RequestAuthentications[before:] {
			ra.Namespace = "demo"
			for _, r := range ra.Spec.TargetRefs {
				if r.Kind == "Service" {
					r.Name = "server"
				}
			}
		}
		objs.Sort()
		res := Translate(LocalDefaults(), &objs, nil)
		cfgs, statuses := WaypointConfigs(LocalDefaults(), &objs, res)
		for _, ra := range objs.RequestAuthentications {
			n++
			var st *PolicyStatus
			for i := range statuses {
				if statuses[i].Kind == kindRA && statuses[i].Name == "demo/"+ra.Name {
					st = &statuses[i]
				}
			}
			if st == nil {
				t.Errorf("%s: %s has no status", f, ra.Name)
				continue
			}
			for i, r := range ra.Spec.JwtRules {
				if r.JwksUri != "" || r.Jwks == "" {
					if !strings.Contains(strings.Join(st.Invalid, "\n"), fieldAt("spec.jwtRules", i)) {
						t.Errorf("%s: %s: rule %d has no inline jwks and is not reported: %+v", f, ra.Name, i, st)
					}
				}
				if len(r.FromCookies) > 0 && !strings.Contains(strings.Join(st.Invalid, "\n"), ".fromCookies") {
					t.Errorf("%s: %s: fromCookies not reported", f, ra.Name)
				}
			}
			if len(ra.Spec.TargetRefs) > 0 {
				if !strings.HasPrefix(st.Message, EnforcedByWaypoint) || len(cfgs["demo/waypoint"].GetAuthentications()) == 0 {
					t.Errorf("%s: %s: %+v, want it on demo/waypoint", f, ra.Name, st)
				}
			}
		}
	}
	t.Logf("%d Istio RequestAuthentications decoded and translated", n)
}
