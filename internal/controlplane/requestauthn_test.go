package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// demoWaypointYAML is namespace demo with waypoint Gateway demo/waypoint.
const demoWaypointYAML = `apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: demo, annotations: {ztunnel-go.io/waypoint-address: 10.96.9.1}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
`

// TestRequestAuthenticationJwksURI: in local mode a RequestAuthentication
// whose rule has jwksUri (not fetched) still reaches its waypoint, with the
// rule marked so that its issuer's tokens are rejected; the config dump
// says which waypoint enforces it and lists the rule's problem with file,
// document and field, logged once.
func TestRequestAuthenticationJwksURI(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "jwt.yaml")
	const data = demoWaypointYAML + `---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: remote-keys, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  jwtRules: [{issuer: https://accounts.example, jwksUri: https://accounts.example/jwks.json}]
`
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	src := local.New(dir, nil, 0)
	if _, err := src.Load(); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	cp := newTestCP(t, src, zap.New(core))
	objs, _ := src.Current()
	cp.Apply(objs)
	cp.Apply(objs)

	wp := cp.wps["demo/waypoint"]
	if a := wp.GetAuthentications(); len(a) != 1 || !strings.Contains(a[0].GetRules()[0].GetError(), "jwksUri") {
		t.Fatalf("waypoint authentications = %v, want remote-keys with its rule marked", a)
	}
	d := cp.ConfigDump()
	want := file + ": document 2 (RequestAuthentication demo/remote-keys): spec.jwtRules[0].jwksUri: "
	if len(d.InvalidValues) != 1 || !strings.HasPrefix(d.InvalidValues[0], want) || !strings.Contains(d.InvalidValues[0], "rejected (401)") {
		t.Fatalf("invalid values %q, want one starting %q", d.InvalidValues, want)
	}
	found := false
	for _, st := range d.Policies {
		if st.Kind == "RequestAuthentication" && st.Name == "demo/remote-keys" {
			found = strings.HasPrefix(st.Message, translate.EnforcedByWaypoint+"demo/waypoint")
		}
	}
	if !found {
		t.Errorf("policies %+v: want remote-keys enforced by demo/waypoint", d.Policies)
	}
	if n := logs.FilterMessageSnippet("cannot be enforced").Len(); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
	for _, l := range d.Ignored {
		if strings.Contains(l, "RequestAuthentication") {
			t.Errorf("still reported as ignored: %s", l)
		}
	}
}
