package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
)

// TestTelemetryAPI: one Telemetry object attached to the waypoint
// (targetRefs to its Gateway) disables a metric, changes the tracing
// sampling and adds an access log provider, and all three take effect in
// the running waypoint without a restart: istio_requests_total leaves its
// /metrics, its config dump shows the new sampling, and the next request
// is written to the provider's file in Istio's default format. Deleting the
// object brings the metric back. The time each took is logged (not
// asserted: timing under a loaded CI machine is not a test's business).
func TestTelemetryAPI(t *testing.T) {
	dir := t.TempDir()
	accessLog := filepath.Join(dir, "access.log")
	meshConfig := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(meshConfig, []byte(`
defaultProviders: {metrics: [prometheus]}
extensionProviders:
- name: prometheus
  prometheus: {}
- name: e2e-file
  envoyFileAccessLog: {path: `+accessLog+`}
- name: otel
  opentelemetry: {service: otel-collector.observability.svc.cluster.local, port: 4317}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	const ns = "telapi"
	ctx := ctxT(t, 120*time.Second)
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: ns, Service: "web",
		Options: meshlab.Options{Name: "telapi", CPArgs: []string{"--mesh-config", meshConfig}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "web") })})

	metrics := func() string {
		t.Helper()
		code, body, err := w.WP.HTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", meshlab.WaypointMetricsPort))
		if err != nil || code != 200 {
			t.Fatalf("waypoint /metrics: %d %v", code, err)
		}
		return string(body)
	}
	sampling := func() float64 {
		t.Helper()
		code, body, err := w.WP.HTTP(ctx, "http://"+meshlab.WaypointAdminAddr+"/config_dump")
		if err != nil || code != 200 {
			t.Fatalf("waypoint /config_dump: %d %v", code, err)
		}
		var dump struct {
			Telemetry struct {
				Tracing struct {
					RandomSamplingPercentage float64 `json:"randomSamplingPercentage"`
				} `json:"tracing"`
			} `json:"telemetry"`
		}
		if err := json.Unmarshal(body, &dump); err != nil {
			t.Fatalf("config dump: %v", err)
		}
		return dump.Telemetry.Tracing.RandomSamplingPercentage
	}
	const requests = `istio_requests_total{`
	request := func() {
		t.Helper()
		if code, _ := w.get(t, "/telemetry-api"); code != 200 {
			t.Fatalf("GET through the waypoint = %d, want 200", code)
		}
	}
	request()
	if m := metrics(); !strings.Contains(m, requests) {
		t.Fatalf("no %s before the Telemetry", requests)
	}
	if s := sampling(); s != 0 {
		t.Fatalf("sampling before the Telemetry = %v, want none (no tracing configured)", s)
	}
	pid := w.WP.Proc.PID()

	const telemetry = `
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: e2e-waypoint, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  metrics:
  - overrides: [{match: {metric: REQUEST_COUNT}, disabled: true}]
  tracing:
  - providers: [{name: otel}]
    randomSamplingPercentage: 42.5
  accessLogging:
  - providers: [{name: e2e-file}]
`
	start := time.Now()
	if err := w.Mesh.Apply("e2e-telemetry-api", []byte(telemetry)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Mesh.Remove("e2e-telemetry-api") })
	var tSampling, tMetric, tLog time.Duration
	deadline := time.Now().Add(30 * time.Second)
	for tSampling == 0 || tMetric == 0 || tLog == 0 {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(accessLog)
			t.Fatalf("after 30 s: sampling %v (%v), metric gone %v, access log %v: %q", sampling(), tSampling, tMetric, tLog, b)
		}
		if tSampling == 0 && sampling() == 42.5 {
			tSampling = time.Since(start)
		}
		if tMetric == 0 && !strings.Contains(metrics(), requests) {
			tMetric = time.Since(start)
		}
		if tLog == 0 {
			request()
			if b, _ := os.ReadFile(accessLog); strings.Contains(string(b), `"GET /telemetry-api HTTP/1.1" 200`) {
				tLog = time.Since(start)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("Telemetry applied: sampling in the config dump after %v, istio_requests_total gone after %v, access log line after %v",
		tSampling, tMetric, tLog)
	// Requests keep being served and not counted; the other metrics are.
	request()
	m := metrics()
	if strings.Contains(m, requests) {
		t.Errorf("%s counted while disabled", requests)
	}
	if !strings.Contains(m, "istio_request_duration_milliseconds_bucket{") {
		t.Error("istio_request_duration_milliseconds missing: only REQUEST_COUNT is disabled")
	}
	b, _ := os.ReadFile(accessLog)
	line := strings.SplitN(string(b), "\n", 2)[0]
	for _, want := range []string{`"GET /telemetry-api HTTP/1.1" 200 - `, `"web.telapi.svc.cluster.local"`} {
		if !strings.Contains(line, want) {
			t.Errorf("access log line %q lacks %q (Istio's default format)", line, want)
		}
	}
	if w.WP.Proc.PID() != pid {
		t.Errorf("waypoint restarted (pid %d → %d)", pid, w.WP.Proc.PID())
	}

	// Removing the object restores the default.
	start = time.Now()
	if err := w.Mesh.Remove("e2e-telemetry-api"); err != nil {
		t.Fatal(err)
	}
	for {
		request()
		if strings.Contains(metrics(), requests) && sampling() == 0 {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("after removing the Telemetry: %s still absent or sampling %v", requests, sampling())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("Telemetry removed: defaults back after %v", time.Since(start))
}
