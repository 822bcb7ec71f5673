package waypoint

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/authn/authntest"
)

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
