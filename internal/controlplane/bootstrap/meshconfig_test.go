package bootstrap

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// TestLoadMeshConfig reads the chart's meshConfig form (Istio field
// names, unknown fields of Istio's ignored) and refuses a file that does
// not parse rather than starting with everything public.
func TestLoadMeshConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(good, []byte(`
accessLogFile: /dev/stdout
defaultServiceExportTo: ["*"]
defaultVirtualServiceExportTo: ["."]
defaultDestinationRuleExportTo: ["."]
serviceEntryVisibility:
  defaultVisibility: NAMESPACE
  policies:
  - visibility: PUBLIC
    matchingRules:
    - namespaceSelector: {matchLabels: {ztunnel-go.io/public-service-entries: "true"}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg translate.Config
	if err := LoadMeshConfig(good, &cfg); err != nil {
		t.Fatal(err)
	}
	sev := cfg.ServiceEntryVisibility
	if !slices.Equal(cfg.DefaultServiceExportTo, []string{"*"}) || !slices.Equal(cfg.DefaultVirtualServiceExportTo, []string{"."}) ||
		sev.GetDefaultVisibility() != meshv1alpha1.ServiceEntryVisibility_NAMESPACE || len(sev.GetPolicies()) != 1 ||
		sev.GetPolicies()[0].GetMatchingRules()[0].GetNamespaceSelector().GetMatchLabels()["ztunnel-go.io/public-service-entries"] != "true" {
		t.Errorf("loaded %+v", cfg)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("serviceEntryVisibility: {defaultVisibility: SOMETIMES}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := LoadMeshConfig(bad, &cfg); err == nil {
		t.Error("an unknown visibility was accepted")
	}
}
