package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// helmTemplate renders the chart with extra helm arguments. deploy/check.sh
// passes its helm as ZTG_HELM_BIN.
func helmTemplate(t *testing.T, args ...string) (string, error) {
	t.Helper()
	helm := os.Getenv("ZTG_HELM_BIN")
	if helm == "" {
		t.Skip("ZTG_HELM_BIN unset: run through deploy/check.sh (make deploy-check)")
	}
	home := t.TempDir()
	cmd := exec.Command(helm, append([]string{"template", "ztunnel-go", "chart/ztunnel-go", "--namespace", systemNamespace}, args...)...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestChartCompatibilityVersion: compatibilityVersion "1.24" restores
// Istio 1.24's default, DNS capture (and the node proxy's DNS proxy) off;
// 1.25 and later, or none, keep it on; an explicit cni.dnsCapture wins; an
// unquoted number or a malformed version is refused with a message naming
// the value.
func TestChartCompatibilityVersion(t *testing.T) {
	numberValues := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(numberValues, []byte("compatibilityVersion: 1.30\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // "true", "false", or an error substring
	}{
		{"default", nil, "true"},
		{"1.24", []string{"--set-string", "compatibilityVersion=1.24"}, "false"},
		{"1.23", []string{"--set-string", "compatibilityVersion=1.23"}, "false"},
		{"1.25", []string{"--set-string", "compatibilityVersion=1.25"}, "true"},
		{"1.30", []string{"--set-string", "compatibilityVersion=1.30"}, "true"},
		{"explicit wins", []string{"--set-string", "compatibilityVersion=1.24", "--set", "cni.dnsCapture=true"}, "true"},
		{"explicit off", []string{"--set", "cni.dnsCapture=false"}, "false"},
		{"malformed", []string{"--set-string", "compatibilityVersion=1.x"}, `compatibilityVersion "1.x": want an Istio release as MAJOR.MINOR`},
		{"YAML number", []string{"-f", numberValues}, "compatibilityVersion 1.3: quote it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helmTemplate(t, tc.args...)
			if tc.want != "true" && tc.want != "false" {
				if err == nil || !strings.Contains(out, tc.want) {
					t.Fatalf("helm template %v: err %v, output %.300q; want an error with %q", tc.args, err, out, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("helm template %v: %v\n%s", tc.args, err, out)
			}
			for _, want := range []string{"- --dns-capture=" + tc.want + "\n", `{name: DNS_PROXY, value: "` + tc.want + `"}`} {
				if !strings.Contains(out, want) {
					t.Errorf("helm template %v: no %q", tc.args, want)
				}
			}
		})
	}
}

// TestChartNodeComponentsOnly: controlPlane.enabled=false renders only the
// node agent and the node proxy (no control plane Deployment, Service,
// webhook, ServiceAccount or RBAC), pointed at the given control plane
// (istiod's address by default) and verifying it with the istio-ca-root-cert
// ConfigMap istiod publishes.
func TestChartNodeComponentsOnly(t *testing.T) {
	out, err := helmTemplate(t, "--set", "controlPlane.enabled=false")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	for _, want := range []string{`{name: XDS_ADDRESS, value: "istiod.istio-system.svc:15012"}`, `{name: CA_ADDRESS, value: "istiod.istio-system.svc:15012"}`,
		"kind: DaemonSet\nmetadata:\n  name: ztunnel\n", "kind: DaemonSet\nmetadata:\n  name: ztunnel-cni\n", "name: istio-ca-root-cert"} {
		if !strings.Contains(out, want) {
			t.Errorf("node-only render lacks %q", want)
		}
	}
	for _, unwanted := range []string{"kind: Deployment", "kind: ValidatingWebhookConfiguration", "kind: PodDisruptionBudget", "name: ztunnel-cp\n"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("node-only render has %q", unwanted)
		}
	}
	out, err = helmTemplate(t, "--set", "controlPlane.enabled=false", "--set", "ztunnel.xdsAddress=cp.example.net:15012", "--set", "ztunnel.caAddress=ca.example.net:15012")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	for _, want := range []string{`{name: XDS_ADDRESS, value: "cp.example.net:15012"}`, `{name: CA_ADDRESS, value: "ca.example.net:15012"}`} {
		if !strings.Contains(out, want) {
			t.Errorf("render with addresses lacks %q", want)
		}
	}
}
