package controlplane

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/jwks"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// TestRequestAuthenticationFetchesJwksURI: a jwksUri rule is pending (its
// issuer's tokens rejected, the config dump says why) until the control
// plane's resolver has fetched the key set; then the control plane
// translates again by itself, the waypoint config is pushed anew and
// nothing is reported invalid.
func TestRequestAuthenticationFetchesJwksURI(t *testing.T) {
	const keySet = `{"keys":[{"kty":"EC","crv":"P-256","kid":"k1","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}`
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/jwks.json" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(keySet))
	}))
	defer srv.Close()
	dir := t.TempDir()
	data := demoWaypointYAML + `---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: remote-keys, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  jwtRules: [{issuer: https://accounts.example, jwksUri: "` + srv.URL + `/jwks.json"}]
`
	if err := os.WriteFile(filepath.Join(dir, "jwt.yaml"), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	src := local.New(dir, nil, 0)
	if _, err := src.Load(); err != nil {
		t.Fatal(err)
	}
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := caserver.NewNodeTokens(map[string]string{"node0": "tok0"})
	if err != nil {
		t.Fatal(err)
	}
	keys := jwks.New(jwks.Config{Client: srv.Client(), AllowInternal: true})
	tcfg := translate.LocalDefaults()
	tcfg.JWKS = keys
	cp, err := New(Config{Source: src, Translate: tcfg, CA: authority, Auth: auth, Log: zap.NewNop(), Debounce: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The first translation, before the resolver runs: pending.
	objs, _ := src.Current()
	cp.Apply(objs)
	d := cp.ConfigDump()
	if len(d.InvalidValues) != 1 || !strings.Contains(d.InvalidValues[0], "not fetched yet") {
		t.Fatalf("before the fetch: invalid values %q, want the jwksUri pending", d.InvalidValues)
	}
	before := cp.XDS().Versions(xds.WaypointType)["demo/waypoint"]

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { keys.Run(ctx); done <- struct{}{} }()
	go func() { cp.loop(ctx); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()
	testkit.Eventually(t, 10*time.Second, "the waypoint config pushed again with the fetched keys, nothing invalid", func() bool {
		d := cp.ConfigDump()
		v := cp.XDS().Versions(xds.WaypointType)["demo/waypoint"]
		return len(d.InvalidValues) == 0 && v != "" && v != before
	})
}
