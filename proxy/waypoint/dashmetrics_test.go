package waypoint

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestRouteAndPolicyMetrics: the dashboards' series. A denial counts under
// the policy that denied it, the default deny under "-"; every HTTP request
// counts under its route ("-" without one) and code.
func TestRouteAndPolicyMetrics(t *testing.T) {
	l := newLab(t, baseConfig(&waypointapi.Policy{
		Name: "deny-admin", Namespace: "demo", Action: waypointapi.Action_DENY,
		Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{prefix("/admin")}}}}},
	}))
	c := l.client(clientID, clientIP)
	for _, path := range []string{"/admin/a", "/admin/b", "/ok"} {
		get(t, c, path)
	}
	value := func(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }
	testkit.Eventually(t, 2*time.Second, "2 denials by demo/deny-admin and 1 route request answered 200", func() bool {
		return value(l.w.metrics.denials.WithLabelValues("demo/deny-admin")) == 2 &&
			value(l.w.metrics.routeRequests.WithLabelValues("-", "200")) == 1
	})
	if n := testutil.CollectAndCount(l.w.metrics.routeDuration); n != 1 {
		t.Errorf("%d route duration series, want 1", n)
	}
}
