package telemetry

import (
	"maps"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// wantKnown are the labels of a request from a workload the waypoint knows
// to an endpoint of the bound service server.demo, as Istio's waypoint
// (istio_stats, reporter "waypoint") labels it: app and version are the
// canonical service and revision (the workload API's), principals are
// SPIFFE URIs, the security policy mutual_tls.
var wantKnown = map[string]string{
	"reporter":                       "waypoint",
	"source_workload":                "client",
	"source_canonical_service":       "client",
	"source_canonical_revision":      "v1",
	"source_workload_namespace":      "demo",
	"source_principal":               "spiffe://cluster.local/ns/demo/sa/sa-client",
	"source_app":                     "client",
	"source_version":                 "v1",
	"source_cluster":                 "Kubernetes",
	"destination_workload":           "server-v1",
	"destination_workload_namespace": "demo",
	"destination_principal":          "spiffe://cluster.local/ns/demo/sa/server",
	"destination_app":                "server",
	"destination_version":            "v1",
	"destination_service":            "server.demo.svc.cluster.local",
	"destination_canonical_service":  "server",
	"destination_canonical_revision": "v1",
	"destination_service_name":       "server",
	"destination_service_namespace":  "demo",
	"destination_cluster":            "Kubernetes",
	"request_protocol":               "http",
	"response_code":                  "200",
	"grpc_response_status":           "",
	"response_flags":                 "-",
	"connection_security_policy":     "mutual_tls",
}

// TestWaypointLabels is the waypoint's half of docs/telemetry.md's label
// table: each case is one row's traffic and the labels Istio's waypoint
// gives it, label by label.
func TestWaypointLabels(t *testing.T) {
	with := func(base map[string]string, kv ...string) map[string]string {
		out := maps.Clone(base)
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	without := func(base map[string]string, keys ...string) map[string]string {
		out := maps.Clone(base)
		for _, k := range keys {
			delete(out, k)
		}
		return out
	}
	cases := []struct {
		name   string
		edit   func(ex *Entry)
		metric string
		want   map[string]string
	}{
		{"known source and destination", func(*Entry) {}, "istio_requests_total", wantKnown},
		{"grpc status", func(ex *Entry) {
			ex.Req = &http.Request{Header: http.Header{"Content-Type": {"application/grpc+proto"}}}
			ex.GRPCStatus = "14"
		}, "istio_requests_total", with(wantKnown, "request_protocol", "grpc", "grpc_response_status", "14")},
		{"grpc without a status", func(ex *Entry) {
			ex.Req = &http.Request{Header: http.Header{"Content-Type": {"application/grpc"}}}
			ex.Code = 503
			ex.Flags = "UF"
		}, "istio_requests_total", with(wantKnown, "request_protocol", "grpc", "response_code", "503", "response_flags", "UF",
			"grpc_response_status", "14")},
		{"http ignores a grpc-status", func(ex *Entry) { ex.GRPCStatus = "0" }, "istio_requests_total", wantKnown},
		{"unknown source", func(ex *Entry) { ex.Source = Peer{Principal: ex.Source.Principal} },
			"istio_requests_total", with(wantKnown, "source_workload", "unknown", "source_canonical_service", "unknown",
				"source_canonical_revision", "latest", "source_app", "unknown", "source_version", "unknown",
				"source_cluster", "unknown")},
		{"denied before routing", func(ex *Entry) {
			ex.Destination = Peer{}
			ex.Code, ex.Flags = 403, "RBAC"
			ex.Verdict.Allow = false
		}, "istio_requests_total", with(wantKnown, "destination_workload", "unknown", "destination_workload_namespace", "unknown",
			"destination_principal", "unknown", "destination_app", "unknown", "destination_version", "unknown",
			"destination_canonical_service", "unknown", "destination_canonical_revision", "unknown",
			"destination_cluster", "unknown", "response_code", "403", "response_flags", "RBAC")},
		{"workload addressed", func(ex *Entry) {
			ex.ServiceName, ex.ServiceNamespace, ex.Attrs.Service = "", "", ""
		}, "istio_requests_total", with(wantKnown, "destination_service", "unknown", "destination_service_name", "unknown",
			"destination_service_namespace", "unknown")},
		{"tcp stream", func(ex *Entry) { ex.Attrs.HTTP = false }, "istio_tcp_connections_opened_total",
			without(with(wantKnown, "request_protocol", "tcp"), "response_code", "grpc_response_status")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec, reg, _ := newTestRecorder(t, Limits{})
			ex := entry(t, true)
			tc.edit(ex)
			rec.Record(ex)
			got := onlySeries(t, reg, tc.metric)
			want := tc.want
			for k, v := range want {
				if g, ok := got[k]; !ok || g != v {
					t.Errorf("%s: %s = %q, want %q", tc.metric, k, got[k], v)
				}
			}
			for k, v := range got {
				if _, ok := want[k]; !ok {
					t.Errorf("%s: unexpected label %s=%q", tc.metric, k, v)
				}
			}
		})
	}
}

// TestWaypointTCPMetrics: an accepted TCP stream counts opened at once and
// its bytes and the close when it ends; a refused one opened and closed
// with its flags and no bytes. The four istio_tcp_* series share the labels.
func TestWaypointTCPMetrics(t *testing.T) {
	rec, reg, _ := newTestRecorder(t, Limits{})
	ex := entry(t, false)
	st := rec.Record(ex)
	if v := value(t, reg, "istio_tcp_connections_opened_total", "response_flags", "-"); v != 1 {
		t.Errorf("opened = %v, want 1", v)
	}
	if v := value(t, reg, "istio_tcp_connections_closed_total", "response_flags", "-"); v != 0 {
		t.Errorf("closed = %v before the stream ended, want 0", v)
	}
	st.Done(100, 2000)
	st.Done(100, 2000) // once
	for name, want := range map[string]float64{
		"istio_tcp_connections_closed_total": 1, "istio_tcp_received_bytes_total": 100, "istio_tcp_sent_bytes_total": 2000,
	} {
		if v := value(t, reg, name, "response_flags", "-"); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	refused := entry(t, false)
	refused.Code, refused.Flags, refused.Verdict.Allow = 403, "RBAC", false
	if st := rec.Record(refused); st != nil {
		t.Error("a refused stream returned a Stream")
	}
	for _, name := range []string{"istio_tcp_connections_opened_total", "istio_tcp_connections_closed_total"} {
		if v := value(t, reg, name, "response_flags", "RBAC"); v != 1 {
			t.Errorf("%s{response_flags=RBAC} = %v, want 1", name, v)
		}
	}
	if n := seriesCount(t, reg, "istio_requests_total"); n != 0 {
		t.Errorf("%d istio_requests_total series for TCP streams, want 0", n)
	}
}

func gather(t *testing.T, reg *prometheus.Registry, name string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

func seriesCount(t *testing.T, reg *prometheus.Registry, name string) int {
	return len(gather(t, reg, name))
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// onlySeries returns the labels of name's one series.
func onlySeries(t *testing.T, reg *prometheus.Registry, name string) map[string]string {
	t.Helper()
	ms := gather(t, reg, name)
	if len(ms) != 1 {
		t.Fatalf("%d %s series, want 1", len(ms), name)
	}
	return labelsOf(ms[0])
}

// value sums name's counters whose labels include the pairs kv.
func value(t *testing.T, reg *prometheus.Registry, name string, kv ...string) float64 {
	t.Helper()
	total := 0.0
series:
	for _, m := range gather(t, reg, name) {
		l := labelsOf(m)
		for i := 0; i+1 < len(kv); i += 2 {
			if l[kv[i]] != kv[i+1] {
				continue series
			}
		}
		total += m.GetCounter().GetValue()
	}
	return total
}
