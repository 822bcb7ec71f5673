package telemetry

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// series returns the label sets of one metric family, each as
// "name=value,..." in label order.
func series(t *testing.T, reg *prometheus.Registry, name string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			out = append(out, labelString(m))
		}
	}
	return out
}

func labelString(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(parts, ",")
}

func httpEntry(t *testing.T) *Entry {
	ex := entry(t, true)
	ex.Attrs.Method, ex.Attrs.Path, ex.Attrs.Host = "GET", "/a?b=1", "server.demo"
	ex.Req, _ = http.NewRequest("GET", "http://server.demo/a?b=1", nil)
	ex.Req.Header.Set("X-App", "shop")
	ex.Req.Header.Set("User-Agent", "curl")
	ex.Duration = 12 * time.Millisecond
	return ex
}

// TestMetricOverrides: a disabled metric leaves /metrics when activated
// and is not counted; tag overrides change (or empty) labels of the
// metrics they name only.
func TestMetricOverrides(t *testing.T) {
	rec, reg, _ := newTestRecorder(t, Limits{})
	rec.Record(httpEntry(t))
	if len(series(t, reg, "istio_requests_total")) != 1 {
		t.Fatal("no request series before the override")
	}
	c := rec.Compile(&waypointapi.Telemetry{MetricOverrides: []*waypointapi.MetricOverride{
		{Metric: waypointapi.Metric_REQUEST_COUNT, Disabled: true},
		{Metric: waypointapi.Metric_REQUEST_DURATION, Tags: []*waypointapi.TagOverride{
			{Name: "request_protocol", Value: &waypointapi.TagValue{Literal: "custom"}},
			{Name: "source_app", Value: &waypointapi.TagValue{Attribute: waypointapi.Attribute_REQUEST_HEADER, Header: "x-app"}},
			{Name: "destination_app", Value: &waypointapi.TagValue{Attribute: waypointapi.Attribute_REQUEST_METHOD}},
			{Name: "response_flags", Remove: true},
		}},
		{Metric: waypointapi.Metric_TCP_OPENED_CONNECTIONS, Disabled: true},
	}})
	rec.Activate(c)
	if got := series(t, reg, "istio_requests_total"); len(got) != 0 {
		t.Errorf("istio_requests_total after disabling: %q", got)
	}
	ex := httpEntry(t)
	ex.Telemetry = c
	rec.Record(ex)
	if got := series(t, reg, "istio_requests_total"); len(got) != 0 {
		t.Errorf("istio_requests_total counted while disabled: %q", got)
	}
	dur := series(t, reg, "istio_request_duration_milliseconds")
	if len(dur) != 1 || !strings.Contains(dur[0], "request_protocol=custom") || !strings.Contains(dur[0], "source_app=shop") ||
		!strings.Contains(dur[0], "destination_app=GET") || !strings.Contains(dur[0], "response_flags=,") {
		t.Errorf("duration series %q", dur)
	}
	size := series(t, reg, "istio_request_bytes")
	if len(size) != 1 || !strings.Contains(size[0], "request_protocol=http") {
		t.Errorf("request size series %q: the override names duration only", size)
	}
	if got := series(t, reg, "ztunnel_waypoint_route_requests_total"); len(got) != 1 {
		t.Errorf("route series %q", got)
	}
	tcp := entry(t, false)
	tcp.Telemetry = c
	rec.Record(tcp).Done(5, 6)
	if got := series(t, reg, "istio_tcp_connections_opened_total"); len(got) != 0 {
		t.Errorf("tcp opened counted while disabled: %q", got)
	}
	if got := series(t, reg, "istio_tcp_sent_bytes_total"); len(got) != 1 {
		t.Errorf("tcp sent series %q", got)
	}
	// Back to the default: the request count returns.
	rec.Activate(nil)
	rec.Record(httpEntry(t))
	if got := series(t, reg, "istio_requests_total"); len(got) != 1 {
		t.Errorf("istio_requests_total after the override went: %q", got)
	}
}

// TestActivateStaleRequest: a request served under the configuration
// before a change that deleted series, and recorded after it, counts no
// metrics (it would bring the disabled series back for good) but still
// writes its access-log line; one under the new generation counts, and a
// change that deletes nothing keeps the generation. TestTelemetryAPI
// failed once this way in CI.
func TestActivateStaleRequest(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	reg := prometheus.NewRegistry()
	rec, err := New(reg, zap.New(core), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	old := rec.Activate(nil)
	before := httpEntry(t)
	before.Generation = old
	rec.Record(before)
	if len(series(t, reg, "istio_requests_total")) != 1 {
		t.Fatal("no request series before the override")
	}
	c := rec.Compile(&waypointapi.Telemetry{MetricOverrides: []*waypointapi.MetricOverride{
		{Metric: waypointapi.Metric_REQUEST_COUNT, Disabled: true},
	}})
	gen := rec.Activate(c)
	if gen == old {
		t.Fatalf("generation %d kept across a change that deleted series", gen)
	}
	lines := logs.Len()
	stale := httpEntry(t)
	stale.Generation = old
	if st := rec.Record(stale); st != nil {
		t.Error("a stale HTTP entry returned a stream")
	}
	if got := series(t, reg, "istio_requests_total"); len(got) != 0 {
		t.Errorf("a request from before the change brought istio_requests_total back: %q", got)
	}
	if n := durationSamples(t, reg); n != 1 {
		t.Errorf("%d duration samples after the stale request, want the first request's 1", n)
	}
	if logs.Len() != lines+1 {
		t.Errorf("access-log lines %d → %d; the stale request's line is still written", lines, logs.Len())
	}
	cur := httpEntry(t)
	cur.Telemetry, cur.Generation = c, gen
	rec.Record(cur)
	if got := series(t, reg, "istio_requests_total"); len(got) != 0 {
		t.Errorf("istio_requests_total counted while disabled: %q", got)
	}
	if n := durationSamples(t, reg); n != 2 {
		t.Errorf("%d duration samples after a request under the new generation, want 2", n)
	}
	if again := rec.Activate(c); again != gen {
		t.Errorf("generation %d → %d for a change that deleted nothing", gen, again)
	}
}

// durationSamples sums the sample counts of istio_request_duration_milliseconds.
func durationSamples(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == "istio_request_duration_milliseconds" {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// TestOverrideAllocs: the request path allocates nothing with a Telemetry
// that only sets tracing (the common case) and nothing either with tag
// overrides of literals, attributes and headers, once the label sets exist.
func TestOverrideAllocs(t *testing.T) {
	rec, _, _ := newTestRecorder(t, Limits{})
	plain := rec.Compile(&waypointapi.Telemetry{Tracing: &waypointapi.Tracing{RandomSamplingPercentage: 10}})
	over := rec.Compile(&waypointapi.Telemetry{MetricOverrides: []*waypointapi.MetricOverride{
		{Metric: waypointapi.Metric_REQUEST_COUNT, Tags: []*waypointapi.TagOverride{
			{Name: "source_app", Value: &waypointapi.TagValue{Attribute: waypointapi.Attribute_REQUEST_HEADER, Header: "x-app"}},
			{Name: "request_protocol", Value: &waypointapi.TagValue{Literal: "x"}},
		}},
		{Metric: waypointapi.Metric_RESPONSE_SIZE, Disabled: true},
	}})
	for _, c := range []*Config{plain, over} {
		ex := httpEntry(t)
		ex.Telemetry = c
		rec.count(ex, "http", "-")
		if n := testing.AllocsPerRun(200, func() { rec.count(ex, "http", "-") }); n != 0 {
			t.Errorf("custom=%v: an HTTP request's metrics allocate %v times, want 0", c.custom, n)
		}
	}
}

// TestAccessLogProviders: a file provider gets Istio's default format, a
// text format or a JSON labels format, only for requests the filter lets
// through.
func TestAccessLogProviders(t *testing.T) {
	rec, _, _ := newTestRecorder(t, Limits{})
	dir := t.TempDir()
	def, text, js := filepath.Join(dir, "default.log"), filepath.Join(dir, "text.log"), filepath.Join(dir, "json.log")
	c := rec.Compile(&waypointapi.Telemetry{AccessLogging: &waypointapi.AccessLogging{
		Providers: []*waypointapi.AccessLogProvider{
			{Name: "default", Kind: &waypointapi.AccessLogProvider_File{File: &waypointapi.FileAccessLog{Path: def}}},
			{Name: "text", Kind: &waypointapi.AccessLogProvider_File{File: &waypointapi.FileAccessLog{Path: text,
				Format: &waypointapi.LogFormat{Text: "%REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE% %REQ(X-APP)% %UNKNOWN_OP% 100%%"}}}},
			{Name: "json", Kind: &waypointapi.AccessLogProvider_File{File: &waypointapi.FileAccessLog{Path: js,
				Format: &waypointapi.LogFormat{Labels: map[string]string{"code": "%RESPONSE_CODE%", "ua": "%REQ(USER-AGENT)%"}}}}},
		},
		Filter: []*waypointapi.LogCondition{{Attribute: waypointapi.Attribute_RESPONSE_CODE, Op: waypointapi.LogCondition_GE, Value: "500"}},
	}})
	ok, failed := httpEntry(t), httpEntry(t)
	ok.Telemetry, failed.Telemetry = c, c
	failed.Code, failed.Flags, failed.Upstream = 503, "UF", "10.0.0.9:80"
	rec.Record(ok)
	rec.Record(failed)
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	d := read(def)
	if strings.Count(d, "\n") != 1 || !strings.Contains(d, `"GET /a?b=1 HTTP/1.1" 503 UF - - "-" 0 0 12 - "-" "curl" "-" "server.demo" "10.0.0.9:80"`) {
		t.Errorf("default format: %q", d)
	}
	if got := read(text); got != "GET /a?b=1 503 shop - 100%\n" {
		t.Errorf("text format: %q", got)
	}
	if got := read(js); got != `{"code":"503","ua":"curl"}`+"\n" {
		t.Errorf("labels format: %q", got)
	}
}

// TestOverridesShareDefaultEntry: a request whose families have no
// override of their own (here only a TCP metric is overridden) uses the
// default path's label-set entry, not a second one over the same series.
func TestOverridesShareDefaultEntry(t *testing.T) {
	rec, _, _ := newTestRecorder(t, Limits{})
	c := rec.Compile(&waypointapi.Telemetry{MetricOverrides: []*waypointapi.MetricOverride{
		{Metric: waypointapi.Metric_TCP_SENT_BYTES, Disabled: true},
	}})
	plain, over := httpEntry(t), httpEntry(t)
	over.Telemetry = c
	rec.Record(plain)
	rec.Record(over)
	if n := len(rec.series.http); n != 1 {
		t.Errorf("%d label-set entries, want 1", n)
	}
}
