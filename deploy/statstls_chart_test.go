package deploy_test

import (
	"strings"
	"testing"
)

// TestChartStatsTLS: ztunnel.statsTLS.secretName mounts the Secret, points
// STATS_TLS_CERT/KEY at it and tells Prometheus to scrape over HTTPS;
// without it none of that is rendered. The deleted-workload grace is passed
// on when set.
func TestChartStatsTLS(t *testing.T) {
	on := []string{
		"- {name: STATS_TLS_CERT, value: /var/run/secrets/stats-tls/tls.crt}",
		"- {name: STATS_TLS_KEY, value: /var/run/secrets/stats-tls/tls.key}",
		"- {name: stats-tls, mountPath: /var/run/secrets/stats-tls, readOnly: true}",
		`secret: {secretName: "metrics-tls"}`,
		"prometheus.io/scheme: https",
	}
	out, err := helmTemplate(t, "--set", "ztunnel.statsTLS.secretName=metrics-tls", "--set", "ztunnel.metricsDeletedWorkloadGrace=10m")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	for _, want := range append(on, `- {name: METRICS_DELETED_WORKLOAD_GRACE, value: "10m"}`) {
		if !strings.Contains(out, want) {
			t.Errorf("with statsTLS.secretName: no %q", want)
		}
	}
	out, err = helmTemplate(t)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	for _, unwanted := range on {
		if strings.Contains(out, unwanted) {
			t.Errorf("by default: %q rendered", unwanted)
		}
	}
	if strings.Contains(out, "METRICS_DELETED_WORKLOAD_GRACE") {
		t.Error("by default: METRICS_DELETED_WORKLOAD_GRACE rendered (the node proxy's default applies)")
	}
}
