package waypoint

import (
	"testing"
	"time"

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
	testkit.Eventually(t, 2*time.Second, "2 denials by demo/deny-admin and 1 route request answered 200", func() bool {
		return l.metric(t, "ztunnel_waypoint_authorization_denials_total", "policy", "demo/deny-admin") == 2 &&
			l.metric(t, "ztunnel_waypoint_route_requests_total", "route", "-", "response_code", "200") == 1
	})
	if n, err := testutil.GatherAndCount(l.reg, "ztunnel_waypoint_route_duration_milliseconds"); err != nil || n != 1 {
		t.Errorf("%d route duration series (%v), want 1", n, err)
	}
}

// metric sums the counters named name whose labels include the name, value
// pairs of labels.
func (l *lab) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := l.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}
