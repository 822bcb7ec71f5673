package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
)

// Kiali's graph queries, reproduced (Kiali is not a Go module we can
// import; read, not copied) from kiali/kiali graph/telemetry/istio/istio.go
// (buildNamespaceTrafficMap: the request and TCP traffic queries),
// graph/telemetry/istio/util/util.go (GetReporter with ambient traffic
// "total": reporter=~"waypoint|<reporter>"; PromQuery wraps every query in
// round(…, 0.001)) and graph/telemetry/istio/appender/security_policy.go
// (the connection_security_policy queries). %[1]s is the namespace, the
// range is Kiali's default 60s.
const (
	kialiRequestsGroupBy = "source_cluster,source_workload_namespace,source_workload,source_canonical_service,source_canonical_revision,destination_cluster,destination_service_namespace,destination_service,destination_service_name,destination_workload_namespace,destination_workload,destination_canonical_service,destination_canonical_revision,request_protocol,response_code,grpc_response_status,response_flags"
	kialiTCPGroupBy      = "app,source_cluster,source_workload_namespace,source_workload,source_canonical_service,source_canonical_revision,destination_cluster,destination_service_namespace,destination_service,destination_service_name,destination_workload_namespace,destination_workload,destination_canonical_service,destination_canonical_revision,response_flags"
	kialiSecurityGroupBy = "source_cluster,source_workload_namespace,source_workload,source_canonical_service,source_canonical_revision,source_principal,destination_cluster,destination_service_namespace,destination_service_name,destination_workload_namespace,destination_workload,destination_canonical_service,destination_canonical_revision,destination_principal,connection_security_policy"
)

var kialiTrafficQueries = []string{
	// Ambient incoming from other namespaces' sources.
	`round(sum(rate(istio_requests_total{reporter="source",source_workload_namespace!="%[1]s",destination_workload_namespace="%[1]s"} [60s])) by (` + kialiRequestsGroupBy + `) > 0,0.001)`,
	// Incoming, reported by the destination side or the waypoint.
	`round(sum(rate(istio_requests_total{reporter=~"waypoint|destination",destination_workload_namespace="%[1]s"} [60s])) by (` + kialiRequestsGroupBy + `) > 0,0.001)`,
	// Outgoing, reported by the source side or the waypoint.
	`round(sum(rate(istio_requests_total{reporter=~"waypoint|source",source_workload_namespace="%[1]s"} [60s])) by (` + kialiRequestsGroupBy + `) > 0,0.001)`,
	// TCP (rate "total": sent and received).
	`round(sum(rate(istio_tcp_sent_bytes_total{reporter=~"waypoint|destination",destination_workload_namespace="%[1]s"} [60s])) by (` + kialiTCPGroupBy + `) > 0,0.001)`,
	`round(sum(rate(istio_tcp_sent_bytes_total{reporter=~"waypoint|source",source_workload_namespace="%[1]s"} [60s])) by (` + kialiTCPGroupBy + `) > 0,0.001)`,
	`round(sum(rate(istio_tcp_received_bytes_total{reporter=~"waypoint|destination",destination_workload_namespace="%[1]s"} [60s])) by (` + kialiTCPGroupBy + `) > 0,0.001)`,
	`round(sum(rate(istio_tcp_received_bytes_total{reporter=~"waypoint|source",source_workload_namespace="%[1]s"} [60s])) by (` + kialiTCPGroupBy + `) > 0,0.001)`,
}

var kialiSecurityQueries = []string{
	// Requests and TCP from workloads outside the namespace to its services.
	`round((sum(rate(istio_requests_total{reporter=~"waypoint|destination",source_workload_namespace!="%[1]s",destination_service_namespace="%[1]s"}[60s])) by (` + kialiSecurityGroupBy + `) > 0)` +
		` OR (sum(rate(istio_tcp_sent_bytes_total{reporter=~"waypoint|destination",source_workload_namespace!="%[1]s",destination_service_namespace="%[1]s"}[60s])) by (` + kialiSecurityGroupBy + `) > 0)` +
		` OR (sum(rate(istio_tcp_received_bytes_total{reporter=~"waypoint|destination",source_workload_namespace!="%[1]s",destination_service_namespace="%[1]s"}[60s])) by (` + kialiSecurityGroupBy + `) > 0),0.001)`,
	// Requests and TCP from inside the namespace (destination side or waypoint).
	`round((sum(rate(istio_requests_total{reporter=~"waypoint|destination",source_workload_namespace="%[1]s"}[60s])) by (` + kialiSecurityGroupBy + `) > 0)` +
		` OR (sum(rate(istio_tcp_sent_bytes_total{reporter=~"waypoint|destination",source_workload_namespace="%[1]s"}[60s])) by (` + kialiSecurityGroupBy + `) > 0)` +
		` OR (sum(rate(istio_tcp_received_bytes_total{reporter=~"waypoint|destination",source_workload_namespace="%[1]s"}[60s])) by (` + kialiSecurityGroupBy + `) > 0),0.001)`,
	// With ztunnel traffic: its source-side TCP telemetry (app="ztunnel"
	// is the scrape target's pod label).
	`round((sum(rate(istio_tcp_sent_bytes_total{app="ztunnel",reporter="source",source_workload_namespace="%[1]s"}[60s])) by (` + kialiSecurityGroupBy + `) > 0)` +
		` OR (sum(rate(istio_tcp_received_bytes_total{app="ztunnel",reporter="source",source_workload_namespace="%[1]s"}[60s])) by (` + kialiSecurityGroupBy + `) > 0),0.001)`,
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s promSample) value() float64 {
	str, _ := s.Value[1].(string)
	v, _ := strconv.ParseFloat(str, 64)
	return v
}

// kialiEdge is a graph edge between two workload nodes, as Kiali's
// workload graph keys them (namespace/workload).
type kialiEdge struct{ from, to string }

// TestTelemetryKialiGraph: Prometheus scrapes the node proxies and the
// waypoint while a client sends HTTP requests to a Service through its
// waypoint (client → waypoint → server). Kiali's graph queries then
// return the three workload nodes, the edges client → waypoint (the
// client's node proxy, reporter source) and waypoint → server (the
// server's node proxy, reporter destination), both with
// connection_security_policy="mutual_tls" in Kiali's security queries,
// and the request rate client → server the waypoint reports.
func TestTelemetryKialiGraph(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: run make deps (Debian package prometheus)")
	}
	const ns = "kiali"
	ctx := ctxT(t, 120*time.Second)
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: ns, Service: "web", Options: meshlab.Options{Name: "kiali"},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "web") })})
	prom := scrapeMesh(t, promBin, w.Mesh, w.WP)
	client, server := ns+"/curl", ns+"/web"

	query := func(tmpl string) []promSample {
		t.Helper()
		r, err := promQuery(prom, fmt.Sprintf(tmpl, ns))
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != "success" {
			t.Fatalf("query %s: %s %s", fmt.Sprintf(tmpl, ns), r.Status, r.Error)
		}
		out := make([]promSample, 0, len(r.Data.Result))
		for _, raw := range r.Data.Result {
			var s promSample
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	node := func(l map[string]string, side string) string {
		return l[side+"_workload_namespace"] + "/" + l[side+"_workload"]
	}
	type graph struct {
		nodes    map[string]bool
		edges    map[kialiEdge]string // edge → the reporter that gave it
		requests float64              // client → server request rate (reporter waypoint)
		mtls     map[kialiEdge]bool   // edges Kiali's security queries mark mutual_tls
		other    map[kialiEdge]string // edges with another policy
	}
	build := func() graph {
		g := graph{nodes: map[string]bool{}, edges: map[kialiEdge]string{}, mtls: map[kialiEdge]bool{}, other: map[kialiEdge]string{}}
		for i, q := range kialiTrafficQueries {
			for _, s := range query(q) {
				from, to := node(s.Metric, "source"), node(s.Metric, "destination")
				g.nodes[from], g.nodes[to] = true, true
				e := kialiEdge{from, to}
				if _, ok := g.edges[e]; !ok {
					g.edges[e] = s.Metric["reporter"]
				}
				if i == 2 && e == (kialiEdge{client, server}) && s.Metric["response_code"] == "200" {
					g.requests += s.value()
				}
			}
		}
		for _, q := range kialiSecurityQueries {
			for _, s := range query(q) {
				e := kialiEdge{node(s.Metric, "source"), node(s.Metric, "destination")}
				if p := s.Metric["connection_security_policy"]; p == "mutual_tls" {
					g.mtls[e] = true
				} else {
					g.other[e] = p
				}
			}
		}
		return g
	}

	var g graph
	var waypoint string
	deadline := time.Now().Add(60 * time.Second)
	for {
		for range 5 {
			if code, _ := w.do(t, "/", nil); code != 200 {
				t.Fatalf("GET / through the waypoint = %d, want 200", code)
			}
		}
		g = build()
		waypoint = ""
		for e := range g.edges {
			if e.from == client && strings.HasPrefix(e.to, "demo/") {
				waypoint = e.to
			}
		}
		toServer := kialiEdge{waypoint, server}
		if waypoint != "" && g.mtls[kialiEdge{client, waypoint}] && g.mtls[toServer] && g.requests > 0 {
			break
		}
		if time.Now().After(deadline) {
			var edges []string
			for e, r := range g.edges {
				edges = append(edges, fmt.Sprintf("%s → %s (%s) mtls=%v other=%q", e.from, e.to, r, g.mtls[e], g.other[e]))
			}
			sort.Strings(edges)
			t.Fatalf("after a minute of traffic, Kiali's queries give waypoint %q, request rate %v, edges:\n  %s",
				waypoint, g.requests, strings.Join(edges, "\n  "))
		}
		time.Sleep(time.Second)
	}
	for _, n := range []string{client, waypoint, server} {
		if !g.nodes[n] {
			t.Errorf("node %s missing from Kiali's graph", n)
		}
	}
	for e, p := range g.other {
		if e.from == client || e.to == server {
			t.Errorf("edge %s → %s has connection_security_policy %q in Kiali's security query, want only mutual_tls", e.from, e.to, p)
		}
	}
	t.Logf("Kiali graph: %s → %s → %s, %v req/s client → server (reporter waypoint)", client, waypoint, server, g.requests)
}
