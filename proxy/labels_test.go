package proxy

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// TestNodeProxyLabels is the node proxy's half of docs/telemetry.md's
// label table: the istio_tcp_* labels of one connection, label by label,
// as Istio's ztunnel (src/proxy/metrics.rs) sets them: app and version
// are the canonical service and revision, principals SPIFFE URIs, the
// source principal only when mTLS proved it, the security policy
// mutual_tls for HBONE whichever side reports, "unknown" for what is not
// known.
func TestNodeProxyLabels(t *testing.T) {
	client := Peer{Workload: "client", Namespace: "apps", CanonicalService: "client-svc", CanonicalRevision: "v1",
		Cluster: "Kubernetes", Region: "r1", Zone: "z1", Identity: identity.MustNew("cluster.local", "apps", "client")}
	server := Peer{Workload: "server", Namespace: "apps", CanonicalService: "server-svc", CanonicalRevision: "v2",
		Cluster: "Kubernetes", Region: "r1", Zone: "z2", Identity: identity.MustNew("cluster.local", "apps", "server")}
	svc := Service{Hostname: "server.apps.svc.cluster.local", Namespace: "apps", Name: "server"}
	known := map[string]string{
		"reporter":                       "source",
		"source_workload":                "client",
		"source_canonical_service":       "client-svc",
		"source_canonical_revision":      "v1",
		"source_workload_namespace":      "apps",
		"source_principal":               "spiffe://cluster.local/ns/apps/sa/client",
		"source_app":                     "client-svc",
		"source_version":                 "v1",
		"source_cluster":                 "Kubernetes",
		"destination_service":            "server.apps.svc.cluster.local",
		"destination_service_namespace":  "apps",
		"destination_service_name":       "server",
		"destination_workload":           "server",
		"destination_canonical_service":  "server-svc",
		"destination_canonical_revision": "v2",
		"destination_workload_namespace": "apps",
		"destination_principal":          "spiffe://cluster.local/ns/apps/sa/server",
		"destination_app":                "server-svc",
		"destination_version":            "v2",
		"destination_cluster":            "Kubernetes",
		"request_protocol":               "tcp",
		"response_flags":                 "-",
		"connection_security_policy":     "mutual_tls",
		"source_region":                  "r1",
		"source_zone":                    "z1",
		"destination_region":             "r1",
		"destination_zone":               "z2",
	}
	with := func(kv ...string) map[string]string {
		out := maps.Clone(known)
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	unknownSource := []string{"source_workload", "unknown", "source_canonical_service", "unknown",
		"source_canonical_revision", "unknown", "source_workload_namespace", "unknown", "source_principal", "unknown",
		"source_app", "unknown", "source_version", "unknown", "source_cluster", "unknown",
		"source_region", "unknown", "source_zone", "unknown"}
	cases := []struct {
		name string
		dir  Direction
		edit func(r *Result)
		want map[string]string
	}{
		{"outbound hbone", Outbound, func(*Result) {}, known},
		{"inbound hbone", Inbound, func(*Result) {}, with("reporter", "destination")},
		{"inbound plaintext", Inbound, func(r *Result) { r.MTLS, r.Src.Identity = false, identity.Identity{} },
			with("reporter", "destination", "connection_security_policy", "unknown", "source_principal", "unknown")},
		{"inbound from an unknown workload", Inbound, func(r *Result) { r.Src = Peer{Identity: r.Src.Identity} },
			with(append(append([]string{}, unknownSource...), "reporter", "destination",
				"source_principal", "spiffe://cluster.local/ns/apps/sa/client")...)},
		{"outbound passthrough", Outbound, func(r *Result) { r.MTLS, r.Dst, r.Service = false, Peer{}, Service{} },
			with("connection_security_policy", "unknown", "destination_service", "unknown",
				"destination_service_namespace", "unknown", "destination_service_name", "unknown",
				"destination_workload", "unknown", "destination_canonical_service", "unknown",
				"destination_canonical_revision", "unknown", "destination_workload_namespace", "unknown",
				"destination_principal", "unknown", "destination_app", "unknown", "destination_version", "unknown",
				"destination_cluster", "unknown", "destination_region", "unknown", "destination_zone", "unknown")},
		{"denied", Inbound, func(r *Result) {}, with("reporter", "destination", "response_flags", "DENY")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r := NewResult(NewMetrics(reg), nil, tc.dir, netip.MustParseAddrPort("10.0.0.1:40000"),
				netip.MustParseAddrPort("10.0.1.2:15008"))
			r.Src, r.Dst, r.Service, r.MTLS = client, server, svc, true
			tc.edit(r)
			var err error
			if tc.want["response_flags"] == "DENY" {
				err = WithReason(ReasonPolicyDenied, errDraining)
			} else {
				r.Opened()
			}
			r.Record(&err)
			mfs, gerr := reg.Gather()
			if gerr != nil {
				t.Fatal(gerr)
			}
			found := false
			for _, mf := range mfs {
				if mf.GetName() != "istio_tcp_connections_opened_total" {
					continue
				}
				if len(mf.GetMetric()) != 1 {
					t.Fatalf("%d opened series, want 1", len(mf.GetMetric()))
				}
				found = true
				got := map[string]string{}
				for _, lp := range mf.GetMetric()[0].GetLabel() {
					got[lp.GetName()] = lp.GetValue()
				}
				if !maps.Equal(got, tc.want) {
					for k := range tc.want {
						if got[k] != tc.want[k] {
							t.Errorf("%s = %q, want %q", k, got[k], tc.want[k])
						}
					}
					for k := range got {
						if _, ok := tc.want[k]; !ok {
							t.Errorf("unexpected label %s", k)
						}
					}
				}
			}
			if !found {
				t.Fatal("no istio_tcp_connections_opened_total")
			}
		})
	}
}
