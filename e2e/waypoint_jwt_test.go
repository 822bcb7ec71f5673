package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint"
)

// Istio's demo key set and tokens (istio/istio security/tools/jwt/samples:
// jwks.json, demo.jwt and groups-scope.jwt, signed with its key.pem; they
// expire in 2118 and 2082), as its "JWT authentication" task uses them.
const (
	istioDemoIssuer = "testing@secure.istio.io"
	istioDemoJWKS   = `{ "keys":[ {"e":"AQAB","kid":"DHFbpoIUqrY8t2zpA2qXfCmr5VO5ZEr4RzHU_-envvQ","kty":"RSA","n":"xAE7eB6qugXyCAG3yhh7pkDkT65pHymX-P7KfIupjf59vsdo91bSP9C8H07pSAGQO1MV_xFj9VswgsCg4R6otmg5PV2He95lZdHtOcU5DXIg_pbhLdKXbi66GlVeK6ABZOUW3WYtnNHD-91gVuoeJT_DwtGGcp4ignkgXfkiEm4sw-4sfb4qdt5oLbyVpmW6x9cfa7vs2WTfURiCrBoUqgBo_-4WTiULmmHSGZHOjzwa8WtrtOQGsAFjIbno85jp6MnGGGZPYZbDAa_b3y5u-YpW7ypZrvD8BgtKVjgtQgZhLAGezMt0ua3DRrWnKqTZ0BJ_EyxOGuHJrLsn00fnMQ"}]}`
	istioDemoJWT    = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkRIRmJwb0lVcXJZOHQyenBBMnFYZkNtcjVWTzVaRXI0UnpIVV8tZW52dlEiLCJ0eXAiOiJKV1QifQ.eyJleHAiOjQ2ODU5ODk3MDAsImZvbyI6ImJhciIsImlhdCI6MTUzMjM4OTcwMCwiaXNzIjoidGVzdGluZ0BzZWN1cmUuaXN0aW8uaW8iLCJzdWIiOiJ0ZXN0aW5nQHNlY3VyZS5pc3Rpby5pbyJ9.CfNnxWP2tcnR9q0vxyxweaF3ovQYHYZl82hAUsn21bwQd9zP7c-LS9qd_vpdLG4Tn1A15NxfCjp5f7QNBUo-KC9PJqYpgGbaXhaGx7bEdFWjcwv3nZzvc7M__ZpaCERdwU7igUmJqYGBYQ51vr2njU9ZimyKkfDe3axcyiBZde7G6dabliUosJvvKOPcKIWPccCgefSj_GNfwIip3-SsFdlR7BtbVUcqR-yv-XOxJ3Uc1MI0tz3uMiiZcyPV7sNCU4KRnemRIMHVOfuvHsU60_GhGbiSFzgPTAa9WTltbnarTbxudb_YEOx12JiwYToeX0DCPb43W1tzIBxgm8NxUg"
	istioGroupsJWT  = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkRIRmJwb0lVcXJZOHQyenBBMnFYZkNtcjVWTzVaRXI0UnpIVV8tZW52dlEiLCJ0eXAiOiJKV1QifQ.eyJleHAiOjM1MzczOTExMDQsImdyb3VwcyI6WyJncm91cDEiLCJncm91cDIiXSwiaWF0IjoxNTM3MzkxMTA0LCJpc3MiOiJ0ZXN0aW5nQHNlY3VyZS5pc3Rpby5pbyIsInNjb3BlIjpbInNjb3BlMSIsInNjb3BlMiJdLCJzdWIiOiJ0ZXN0aW5nQHNlY3VyZS5pc3Rpby5pbyJ9.EdJnEZSH6X8hcyEii7c8H5lnhgjB5dwo07M5oheC8Xz8mOllyg--AHCFWHybM48reunF--oGaG6IXVngCEpVF0_P5DwsUoBgpPmK1JOaKN6_pe9sh0ZwTtdgK_RP01PuI7kUdbOTlkuUi2AO-qUyOm7Art2POzo36DLQlUXv8Ad7NBOqfQaKjE9ndaPWT7aexUsBHxmgiGbz1SyLH879f7uHYPbPKlpHU6P9S-DaKnGLaEchnoKnov7ajhrEhGXAQRukhDPKUHO9L30oPIr5IJllEQfHYtt6IZvlNUGeLUcif3wpry1R5tBXRicx2sXMQ7LyuDremDbcNy_iE76Upg"
)

// TestWaypointJWT runs the real cmd/waypoint (examples/' demo/waypoint) in a
// two-node mesh with the real node proxies: service "api" in namespace jwt
// uses the waypoint, a RequestAuthentication from the YAML directory
// (targetRefs to the Service, Istio's demo JWKS inline) and a
// requestPrincipals ALLOW on /secure. Through client node proxy → waypoint →
// api's node proxy: a valid token is 200 (and the backend does not see it),
// a bad one 401 with Envoy's body, none 403; a claims condition tells
// Istio's two demo tokens apart.
func TestWaypointJWT(t *testing.T) {
	ctx := ctxT(t, 90*time.Second)
	// The key server below is plain http on loopback: the chart's opt-in
	// (controlPlane.jwks.allowHTTP/allowInternal); by default ztunnel-cp
	// refuses both (TestResolverRefusesInternal).
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "jwt", Service: "api",
		Options: meshlab.Options{CPArgs: []string{"--jwks-allow-http", "--jwks-allow-internal"}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "api path=%s authorization=%q", r.URL.Path, r.Header.Get("Authorization"))
		})})
	m, wp := w.Mesh, w.WP
	bearer := func(token string) http.Header {
		if token == "" {
			return nil
		}
		return http.Header{"Authorization": {"Bearer " + token}}
	}
	get := func(t *testing.T, path, token string) (int, string) {
		t.Helper()
		return w.do(t, path, bearer(token))
	}
	waitCode := func(t *testing.T, path, token string, want int) string {
		t.Helper()
		return w.waitCode(t, path, bearer(token), want)
	}
	waitCode(t, "/secure", "", http.StatusOK) // no policy yet

	// The key set is served by jwksUri, as in Istio's JWT task: an HTTP
	// server in node 0's namespace, where ztunnel-cp runs and fetches it
	// for the waypoint (internal/controlplane/jwks).
	keysLn, err := m.Cluster.Node(0).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var keyFetches atomic.Int32
	keysSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/jwks.json" {
			http.NotFound(w, r)
			return
		}
		keyFetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, istioDemoJWKS)
	})}
	go func() { _ = keysSrv.Serve(keysLn) }()
	t.Cleanup(func() { keysSrv.Close() })
	jwksURI := "http://" + keysLn.Addr().String() + "/jwks.json"

	apply(t, m, "e2e-wp-jwt", `
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt-example, namespace: jwt}
spec:
  targetRefs: [{kind: Service, group: "", name: api}]
  jwtRules:
  - issuer: `+istioDemoIssuer+`
    jwksUri: `+jwksURI+`
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: require-jwt, namespace: jwt}
spec:
  targetRefs: [{kind: Service, group: "", name: api}]
  rules:
  - from: [{source: {requestPrincipals: ["`+istioDemoIssuer+`/`+istioDemoIssuer+`"]}}]
    to: [{operation: {paths: ["/secure*"]}}]
  - from: [{source: {requestPrincipals: ["*"]}}]
    to: [{operation: {paths: ["/group1*"]}}]
    when: [{key: "request.auth.claims[groups]", values: [group1]}]
`)
	// The policy arrives with a push: no token turns to 403.
	if body := waitCode(t, "/secure", "", http.StatusForbidden); body != waypoint.DeniedBody {
		t.Errorf("no token: body %q, want %q", body, waypoint.DeniedBody)
	}
	// Until ztunnel-cp has fetched the keys the token is refused (401),
	// then accepted.
	waitCode(t, "/secure", istioDemoJWT, http.StatusOK)
	if keyFetches.Load() == 0 {
		t.Error("the jwksUri was never fetched")
	}
	code, body := get(t, "/secure", istioDemoJWT)
	if code != http.StatusOK || !strings.Contains(body, "path=/secure") || !strings.Contains(body, `authorization=""`) {
		t.Errorf("valid token = %d %q, want 200 from api without the token (forwardOriginalToken is false)", code, body)
	}
	bad := istioDemoJWT[:len(istioDemoJWT)-4] + "AAAA" // signature altered
	if code, body := get(t, "/secure", bad); code != http.StatusUnauthorized || body != "Jwt verification fails" {
		t.Errorf("bad token = %d %q, want 401 %q", code, body, "Jwt verification fails")
	}
	if code, body := get(t, "/secure", "not-a-jwt"); code != http.StatusUnauthorized || !strings.HasPrefix(body, "Jwt is not in the form") {
		t.Errorf("malformed token = %d %q, want 401", code, body)
	}
	// request.auth.claims[groups]: only groups-scope.jwt carries group1.
	if code, _ := get(t, "/group1", istioGroupsJWT); code != http.StatusOK {
		t.Errorf("groups token on /group1 = %d, want 200", code)
	}
	if code, _ := get(t, "/group1", istioDemoJWT); code != http.StatusForbidden {
		t.Errorf("demo token (no groups) on /group1 = %d, want 403", code)
	}

	actx := ctxT(t, 30*time.Second)
	if _, err := wp.WaitAccessLog(actx, func(a meshlab.AccessLog) bool {
		return a.Str("path") == "/secure" && a.Str("code") == "200" && a.Str("request.principal") == istioDemoIssuer+"/"+istioDemoIssuer &&
			a.Str("authz.policy") == "jwt/require-jwt" && a.Str("src.identity") == spiffe("jwt", "curl")
	}); err != nil {
		t.Error(err)
	}
	if _, err := wp.WaitAccessLog(actx, func(a meshlab.AccessLog) bool {
		return a.Str("path") == "/secure" && a.Str("code") == "401" && strings.Contains(a.Str("error"), "jwt/jwt-example")
	}); err != nil {
		t.Error(err)
	}
}
