package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func codesOf(fs []finding) map[string][]finding {
	m := map[string][]finding{}
	for _, f := range fs {
		m[f.Code] = append(m[f.Code], f)
	}
	return m
}

func TestAnalyzeBrokenDir(t *testing.T) {
	fs, err := analyzeDir("testdata/analyze/broken")
	if err != nil {
		t.Fatal(err)
	}
	got := codesOf(fs)
	want := map[string]string{
		codeInvalidValue:    "AuthorizationPolicy shop/bad-cidr",
		codeTargetNothing:   "AuthorizationPolicy shop/to-missing",
		codeSelectsNothing:  "AuthorizationPolicy shop/nobody",
		codeNoWaypoint:      "AuthorizationPolicy shop/to-alias",
		codeExternalName:    "AuthorizationPolicy shop/to-alias",
		codeStrictNonMesh:   "PeerAuthentication shop/strict",
		codeSENoAddress:     "ServiceEntry shop/ext",
		codeIgnoredKind:     "Sidecar shop/default",
		codeRouteNotApplied: "VirtualService shop/web-routes",
	}
	if n := len(got[codeInvalidValue]); n != 2 {
		t.Errorf("invalid values: got %d findings, want 2 (CIDR, port): %+v", n, got[codeInvalidValue])
	} else if !strings.Contains(got[codeInvalidValue][1].Message, `"http" is not a port number`) {
		t.Errorf("port finding: %s", got[codeInvalidValue][1].Message)
	}
	got[codeInvalidValue] = got[codeInvalidValue][:1]
	for code, obj := range want {
		if len(got[code]) != 1 || got[code][0].Object != obj {
			t.Errorf("%s: got %+v, want one finding on %s", code, got[code], obj)
			continue
		}
		if got[code][0].Fix == "" {
			t.Errorf("%s has no fix", code)
		}
	}
	if m := got[codeInvalidValue][0].Message; !strings.Contains(m, `"10.0.0.0/33" is not a CIDR`) || !strings.Contains(m, "denies all traffic") {
		t.Errorf("invalid-value finding does not say what and what the control plane did: %s", m)
	}
	if f := got[codeRouteNotApplied]; len(f) == 1 && (!strings.Contains(f[0].Message, "no service bound to a waypoint uses it") || !strings.Contains(f[0].Fix, "istio.io/use-waypoint")) {
		t.Errorf("VirtualService finding: %+v", f[0])
	}
	if m := got[codeStrictNonMesh][0].Message; !strings.Contains(m, "legacy") || strings.Contains(m, "kube-system") {
		t.Errorf("STRICT finding should name legacy, not kube-system: %s", m)
	}
	for _, f := range got[codeNoWaypoint] {
		if f.Object == "AuthorizationPolicy shop/to-missing" {
			t.Errorf("to-missing reported twice (attaches to nothing and no waypoint)")
		}
	}
	for i := 1; i < len(fs); i++ {
		if fs[i-1].Code > fs[i].Code {
			t.Fatalf("findings not sorted by code: %v", fs)
		}
	}
}

func TestAnalyzeCleanDirExitsZero(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"analyze", "testdata/analyze/clean"}, &out, &out); err != nil {
		t.Fatalf("clean dir: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "no problems found") {
		t.Errorf("clean dir output: %s", out.String())
	}
}

func TestAnalyzeExitCodeAndFormats(t *testing.T) {
	var table bytes.Buffer
	err := run([]string{"analyze", "testdata/analyze/broken"}, &table, &table)
	if !errors.Is(err, errFindings) {
		t.Fatalf("broken dir: err %v, want errFindings", err)
	}
	if !strings.HasPrefix(table.String(), "CODE") || !strings.Contains(table.String(), "ZTG0002") {
		t.Errorf("table output: %s", table.String())
	}
	for _, format := range []string{"json", "yaml"} {
		var out bytes.Buffer
		if err := run([]string{"analyze", "-o", format, "testdata/analyze/broken"}, &out, &out); !errors.Is(err, errFindings) {
			t.Fatalf("%s: err %v", format, err)
		}
		b := out.Bytes()
		if format == "yaml" {
			var err error
			if b, err = yaml.YAMLToJSON(b); err != nil {
				t.Fatal(err)
			}
		}
		var doc struct{ Findings []finding }
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v\n%s", format, err, out.String())
		}
		if c := codesOf(doc.Findings); len(c[codeTargetNothing]) != 1 || len(c[codeIgnoredKind]) != 1 {
			t.Errorf("%s findings: %+v", format, doc.Findings)
		}
	}
	if err := run([]string{"analyze", "-o", "xml", "testdata/analyze/clean"}, &table, &table); err == nil {
		t.Error("-o xml accepted")
	}
}

func TestAnalyzeReportsBadDocument(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: x\nspec:\n  nope: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fs, err := analyzeDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c := codesOf(fs); len(c[codeDecode]) != 1 || c[codeDecode][0].Level != levelError || !strings.Contains(c[codeDecode][0].Message, "bad.yaml") {
		t.Errorf("decode finding: %+v", fs)
	}
}

func TestAnalyzeWaypointPolicyEnforcedIsClean(t *testing.T) {
	fs, err := analyzeDir("testdata/analyze/waypoint")
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 0 {
		t.Errorf("a policy a waypoint enforces is reported: %+v", fs)
	}
}

func TestAnalyzeCustomPolicyNotSent(t *testing.T) {
	dir := t.TempDir()
	doc := `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ext-authz, namespace: demo}
spec:
  action: CUSTOM
  provider: {name: opa}
  rules: [{}]
`
	if err := os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	fs, err := analyzeDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := codesOf(fs)
	if len(c[codeNotSent]) != 1 || !strings.Contains(c[codeNotSent][0].Message, "CUSTOM") {
		t.Errorf("CUSTOM policy: %+v", fs)
	}
}

// TestAnalyzeRouteRefNotPermitted: a route whose backendRef names another
// namespace without a ReferenceGrant is reported with the reason the
// control plane writes into its status.parents, and a fix naming the grant.
func TestAnalyzeRouteRefNotPermitted(t *testing.T) {
	dir := t.TempDir()
	doc := `apiVersion: v1
kind: Service
metadata: {name: front, namespace: evil}
spec: {selector: {app: front}, clusterIP: 10.96.0.20, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: payments, namespace: shop}
spec: {selector: {app: payments}, clusterIP: 10.96.0.21, ports: [{name: http, port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: steal, namespace: evil}
spec:
  parentRefs: [{group: "", kind: Service, name: front}]
  rules: [{backendRefs: [{name: payments, namespace: shop, port: 80}]}]
`
	if err := os.WriteFile(filepath.Join(dir, "r.yaml"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	fs, err := analyzeDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := codesOf(fs)
	if len(c[codeRouteStatus]) != 1 || c[codeRouteStatus][0].Object != "HTTPRoute evil/steal" ||
		!strings.HasPrefix(c[codeRouteStatus][0].Message, "RefNotPermitted: ") || !strings.Contains(c[codeRouteStatus][0].Fix, "ReferenceGrant") {
		t.Errorf("route findings: %+v", fs)
	}
}

// TestAnalyzeStrictWaypointInMesh: under STRICT, a waypoint's pod (not
// captured: istio.io/dataplane-mode none) is not a pod outside the mesh,
// whether marked by the managed label or by its Gateway's name; an
// ordinary pod that opted out still is.
func TestAnalyzeStrictWaypointInMesh(t *testing.T) {
	doc := `apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: shop}
spec: {mtls: {mode: STRICT}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop, annotations: {ztunnel-go.io/waypoint-address: 10.96.9.9}}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}
---
apiVersion: v1
kind: Pod
metadata: {name: waypoint-0, namespace: shop, labels: {gateway.networking.k8s.io/gateway-name: waypoint, istio.io/dataplane-mode: none}}
spec: {nodeName: node0, containers: [{name: istio-proxy, image: waypoint}]}
---
apiVersion: v1
kind: Pod
metadata: {name: managed-0, namespace: shop, labels: {gateway.istio.io/managed: istio.io-mesh-controller, istio.io/dataplane-mode: none}}
spec: {nodeName: node0, containers: [{name: istio-proxy, image: waypoint}]}
`
	for _, tc := range []struct {
		extra string
		want  int
	}{
		{"", 0},
		{`---
apiVersion: v1
kind: Pod
metadata: {name: opted-out, namespace: shop, labels: {istio.io/dataplane-mode: none}}
spec: {nodeName: node0, containers: [{name: app, image: app}]}
`, 1},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "mesh.yaml"), []byte(doc+tc.extra), 0o644); err != nil {
			t.Fatal(err)
		}
		fs, err := analyzeDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := codesOf(fs)[codeStrictNonMesh]; len(got) != tc.want {
			t.Errorf("with %d opted-out app pods: STRICT findings %+v, want %d", tc.want, got, tc.want)
		}
	}
}

// TestAnalyzeServiceEntryAddressOwned: zctl analyze reports each address
// the control plane refuses a ServiceEntry (the same translation decides
// both), and only those.
func TestAnalyzeServiceEntryAddressOwned(t *testing.T) {
	fs, err := analyzeDir("testdata/analyze/tenant")
	if err != nil {
		t.Fatal(err)
	}
	got := codesOf(fs)[codeAddressOwned]
	if len(got) != 2 {
		t.Fatalf("findings %s: %+v, want 2 (0.0.0.0/0, the ClusterIP)", codeAddressOwned, fs)
	}
	for i, want := range []string{"spec.addresses[0]: 0.0.0.0/0 covers every address", "spec.addresses[1]: 10.96.0.10 is the address of Service victim/web"} {
		if got[i].Object != "ServiceEntry evil/grab" || got[i].Level != levelError || !strings.Contains(got[i].Message, want) {
			t.Errorf("finding %d: %+v, want %q on ServiceEntry evil/grab", i, got[i], want)
		}
	}
}
