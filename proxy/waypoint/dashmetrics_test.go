package waypoint

import (
	"context"
	"io"
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

// TestIstioLabelsThroughWaypoint: the labels a request and a TCP stream get
// from the waypoint's state, end to end: the client's and the endpoint's
// canonical service, revision and cluster from the workload API, their
// principals as SPIFFE URIs; a TCP stream's bytes in both directions and
// its close, once the stream ends.
func TestIstioLabelsThroughWaypoint(t *testing.T) {
	l := newLab(t, baseConfig())
	if code, _ := get(t, l.client(clientID, clientIP), "/ok"); code != 200 {
		t.Fatalf("GET /ok = %d, want 200", code)
	}
	want := []string{"reporter", "waypoint",
		"source_workload", "client", "source_canonical_service", "client", "source_canonical_revision", "v1",
		"source_app", "client", "source_version", "v1", "source_cluster", "Kubernetes",
		"source_workload_namespace", "demo", "source_principal", "spiffe://cluster.local/ns/demo/sa/sa-client",
		"destination_workload", "server-v1", "destination_canonical_service", "server-v1",
		"destination_canonical_revision", "v1", "destination_app", "server-v1", "destination_version", "v1",
		"destination_cluster", "Kubernetes", "destination_principal", "spiffe://cluster.local/ns/demo/sa/sa-v1",
		"destination_service", "server.demo.svc.cluster.local", "destination_service_name", "server",
		"destination_service_namespace", "demo", "request_protocol", "http", "response_code", "200",
		"response_flags", "-", "connection_security_policy", "mutual_tls"}
	testkit.Eventually(t, 2*time.Second, "istio_requests_total with every label of the request", func() bool {
		return l.metric(t, "istio_requests_total", want...) == 1
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := l.tunnel(ctx, clientID, clientIP, svcVIP+":9000")
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("hello through the waypoint")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	tcp := []string{"reporter", "waypoint", "request_protocol", "tcp", "source_canonical_service", "client",
		"destination_workload", "server-v1", "destination_service_name", "server", "response_flags", "-"}
	if got := l.metric(t, "istio_tcp_connections_opened_total", tcp...); got != 1 {
		t.Errorf("istio_tcp_connections_opened_total = %v while the stream is open, want 1", got)
	}
	c.Close()
	n := float64(len(msg))
	testkit.Eventually(t, 5*time.Second, "the stream's close and bytes counted", func() bool {
		return l.metric(t, "istio_tcp_connections_closed_total", tcp...) == 1 &&
			l.metric(t, "istio_tcp_received_bytes_total", tcp...) == n &&
			l.metric(t, "istio_tcp_sent_bytes_total", tcp...) == n
	})
}
