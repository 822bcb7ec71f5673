package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// sidecarCRD is enough of Istio's Sidecar CRD to store one: analyze must
// list the kinds the control plane ignores from the API server too.
const sidecarCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: sidecars.networking.istio.io}
spec:
  group: networking.istio.io
  names: {kind: Sidecar, listKind: SidecarList, plural: sidecars, singular: sidecar}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

func findingKeys(fs []finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Code+" "+f.Level+" "+f.Object+": "+f.Message)
	}
	sort.Strings(out)
	return out
}

// TestAnalyzeLiveCluster runs analyze --kubeconfig against a real API
// server: bare, it reports the kinds the control plane needs that are not
// served; with the CRDs and testdata/analyze/live applied, it reports
// exactly what analyze reports for that directory.
func TestAnalyzeLiveCluster(t *testing.T) {
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	live := func() ([]finding, string, error) {
		var out bytes.Buffer
		err := run([]string{"analyze", "--kubeconfig", api.Kubeconfig(), "-o", "json"}, &out, &out)
		var got struct{ Findings []finding }
		if jerr := json.Unmarshal(out.Bytes(), &got); jerr != nil {
			t.Fatalf("analyze: %v, %v\n%s", err, jerr, out.String())
		}
		return got.Findings, out.String(), err
	}
	fs, out, err := live()
	if !errors.Is(err, errFindings) {
		t.Errorf("bare cluster: %v, want error findings\n%s", err, out)
	}
	notServed := map[string]bool{}
	for _, f := range fs {
		if f.Code == codeKindNotServed {
			notServed[f.Object] = f.Fix != ""
		}
	}
	for _, k := range []string{"ServiceEntry (networking.istio.io/v1)", "AuthorizationPolicy (security.istio.io/v1)", "Gateway (gateway.networking.k8s.io/v1)"} {
		if !notServed[k] {
			t.Errorf("bare cluster: no %s finding with a fix for %s: %+v", codeKindNotServed, k, fs)
		}
	}

	if err := api.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	if err := api.Apply(ctx, []byte(sidecarCRD), kubeapi.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := api.WaitCRDsEstablished(ctx, "sidecars.networking.istio.io"); err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile("testdata/analyze/live/mesh.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := api.Apply(ctx, manifest, kubeapi.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	want, err := analyzeDir("testdata/analyze/live")
	if err != nil {
		t.Fatal(err)
	}
	fs, out, err = live()
	if !errors.Is(err, errFindings) {
		t.Errorf("live cluster: %v, want error findings (the bad port)\n%s", err, out)
	}
	g, w := findingKeys(fs), findingKeys(want)
	if strings.Join(g, "\n") != strings.Join(w, "\n") {
		t.Errorf("live findings differ from the directory's:\nlive:\n%s\ndirectory:\n%s", strings.Join(g, "\n"), strings.Join(w, "\n"))
	}
	// The directory itself has what the live check must see.
	codes := codesOf(want)
	for _, c := range []string{codeInvalidValue, codeSelectsNothing, codeExternalName, codeStrictNonMesh, codeSENoAddress, codeDNSCaptureSE, codeIgnoredKind} {
		if len(codes[c]) == 0 {
			t.Errorf("testdata/analyze/live gives no %s finding: %s", c, strings.Join(w, "\n"))
		}
	}
	if f := codes[codeDNSCaptureSE]; len(f) != 1 || f[0].Object != "Pod shop/no-dns" || !strings.Contains(f[0].Message, "ServiceEntry shop/ext (auto-allocated address for api.example.com)") {
		t.Errorf("DNS capture finding: %+v", f)
	}
}
