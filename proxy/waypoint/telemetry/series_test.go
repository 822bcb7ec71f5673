package telemetry

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestHTTPSeriesCache: one label tuple and route is looked up once and
// kept; another response code or route is its own set of series, and the
// cached ones count into the registered vectors.
func TestHTTPSeriesCache(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	lv := func(code string) []string {
		return []string{"waypoint", "client", "demo", "cluster.local/ns/demo/sa/client", "server.demo.svc.cluster.local",
			"server", "demo", "server-v1", "demo", "cluster.local/ns/demo/sa/server", "http", code, "-", "mutual_tls"}
	}
	a, b := m.httpSeriesFor(lv("200"), "demo/r"), m.httpSeriesFor(lv("200"), "demo/r")
	if a != b {
		t.Fatal("the same labels and route gave two series sets")
	}
	if c, d := m.httpSeriesFor(lv("503"), "demo/r"), m.httpSeriesFor(lv("200"), "-"); c == a || d == a || c == d {
		t.Fatal("another code or route shares a cached series set")
	}
	a.requests.Inc()
	b.requests.Inc()
	if got := testutil.ToFloat64(m.requests.WithLabelValues(lv("200")...)); got != 2 {
		t.Errorf("istio_requests_total{code=200} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.routeRequests.WithLabelValues("demo/r", "200")); got != 0 {
		t.Errorf("route series = %v before any route increment, want 0", got)
	}
	a.routeRequests.Inc()
	if got := testutil.ToFloat64(m.routeRequests.WithLabelValues("demo/r", "200")); got != 1 {
		t.Errorf("route series = %v, want 1", got)
	}
}
