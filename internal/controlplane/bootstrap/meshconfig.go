package bootstrap

import (
	"encoding/json"
	"fmt"
	"os"

	"google.golang.org/protobuf/encoding/protojson"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// LoadMeshConfig reads an Istio MeshConfig (YAML or JSON, the format of
// istiod's "mesh" ConfigMap key and of Helm's meshConfig value) and copies
// the fields this control plane honours into cfg: defaultServiceExportTo,
// defaultVirtualServiceExportTo, defaultDestinationRuleExportTo,
// serviceEntryVisibility, serviceScopeConfigs, pathNormalization, the Telemetry API's
// extensionProviders and defaultProviders, and
// defaultConfig.tracing.sampling. Other fields are Istio's and ignored
// here. A file
// that does not parse is an error: starting with everything public instead
// would widen what the operator narrowed.
func LoadMeshConfig(path string, cfg *translate.Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("mesh config: %w", err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return fmt.Errorf("mesh config %s: %w", path, err)
	}
	// Only the honoured fields are decoded, strictly: an unknown
	// visibility name must fail, not be dropped (DiscardUnknown would).
	var all map[string]json.RawMessage
	if err := json.Unmarshal(j, &all); err != nil {
		return fmt.Errorf("mesh config %s: %w", path, err)
	}
	ours := map[string]json.RawMessage{}
	for _, k := range []string{"defaultServiceExportTo", "defaultVirtualServiceExportTo", "defaultDestinationRuleExportTo", "serviceEntryVisibility", "pathNormalization",
		"extensionProviders", "defaultProviders", "serviceScopeConfigs"} {
		if v, ok := all[k]; ok {
			ours[k] = v
		}
	}
	sub, _ := json.Marshal(ours) // raw messages: cannot fail
	var mc meshv1alpha1.MeshConfig
	if err := protojson.Unmarshal(sub, &mc); err != nil {
		return fmt.Errorf("mesh config %s: %w", path, err)
	}
	cfg.DefaultServiceExportTo = mc.GetDefaultServiceExportTo()
	cfg.DefaultVirtualServiceExportTo = mc.GetDefaultVirtualServiceExportTo()
	cfg.DefaultDestinationRuleExportTo = mc.GetDefaultDestinationRuleExportTo()
	cfg.ServiceEntryVisibility = mc.GetServiceEntryVisibility()
	if err := translate.ValidateServiceScopeConfigs(mc.GetServiceScopeConfigs()); err != nil {
		return fmt.Errorf("mesh config %s: %w", path, err)
	}
	cfg.ServiceScopeConfigs = mc.GetServiceScopeConfigs()
	if pn := mc.GetPathNormalization(); pn != nil {
		cfg.PathNormalization = waypointapi.PathNormalization(pn.GetNormalization())
	}
	// defaultConfig is a ProxyConfig of which only tracing.sampling is
	// read (the default sampling of the Telemetry API): the rest is
	// Envoy's and may hold fields of newer Istio versions.
	if dc, ok := all["defaultConfig"]; ok {
		var pc meshv1alpha1.ProxyConfig
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(dc, &pc); err != nil {
			return fmt.Errorf("mesh config %s: defaultConfig: %w", path, err)
		}
		mc.DefaultConfig = &pc
	}
	tm, problems := translate.MeshTelemetry(&mc)
	cfg.Telemetry = tm
	cfg.MeshProblems = problems
	return nil
}
