package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// TestChartDashboards: dashboards.enabled renders one ConfigMap, labelled
// for Grafana's dashboard sidecar, holding every dashboards/*.json file
// byte for byte (each valid JSON); off by default. The panels' queries are
// run against a real Prometheus by e2e's TestDashboardQueries.
func TestChartDashboards(t *testing.T) {
	out, err := helmTemplate(t, "--set", "dashboards.enabled=true", "--show-only", "templates/dashboards.yaml")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	objs, err := kubeapi.DecodeObjects([]byte(out))
	if err != nil || len(objs) != 1 || objs[0].GetKind() != "ConfigMap" {
		t.Fatalf("rendered %d objects (%v), want one ConfigMap", len(objs), err)
	}
	var cm corev1.ConfigMap
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, &cm); err != nil {
		t.Fatal(err)
	}
	if cm.Labels["grafana_dashboard"] != "1" || cm.Namespace != systemNamespace {
		t.Errorf("ConfigMap labels %v namespace %q; want grafana_dashboard=1 in %s", cm.Labels, cm.Namespace, systemNamespace)
	}
	files, _ := filepath.Glob("chart/ztunnel-go/dashboards/*.json")
	if len(files) < 2 || len(cm.Data) != len(files) {
		t.Fatalf("%d dashboards in the ConfigMap, %d files (%v)", len(cm.Data), len(files), files)
	}
	for _, f := range files {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got := cm.Data[filepath.Base(f)]
		if got != strings.TrimRight(string(want), "\n") {
			t.Errorf("%s: the ConfigMap's copy differs from the file", f)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("%s: not valid JSON in the ConfigMap", f)
		}
	}
	out, err = helmTemplate(t)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "ztunnel-go-dashboards") {
		t.Error("the dashboards ConfigMap is rendered by default")
	}
}
