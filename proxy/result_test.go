package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

func TestResultRecordsOnceWithFields(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	core, logs := observer.New(zap.DebugLevel)
	src := netip.MustParseAddrPort("10.0.0.1:40000")
	dst := netip.MustParseAddrPort("10.0.1.2:15008")
	r := NewResult(m, zap.New(core), Inbound, src, dst)
	r.Src = Peer{Workload: "client", Namespace: "apps", Identity: identity.MustNew("cluster.local", "apps", "client")}
	r.Dst = Peer{Workload: "server", Namespace: "apps", Identity: identity.MustNew("cluster.local", "apps", "server"), Zone: "z1"}
	r.Service = Service{Hostname: "server.apps.svc.cluster.local", Namespace: "apps", Name: "server"}
	r.HBONEAddr = netip.MustParseAddrPort("10.0.1.2:8080")
	r.MTLS = true
	if o := m.Open(); o != 1 {
		t.Errorf("Open() = %d with one connection open", o)
	}
	r.Counters.Sent.Add(100)
	r.Counters.Received.Add(7)
	err := WithReason(ReasonPolicyDenied, errors.New("explicitly denied by apps/deny-all"))
	r.Record(&err)
	r.Record(&err) // a second call must not count twice

	if n := logs.Len(); n != 1 {
		t.Fatalf("%d log lines, want exactly 1", n)
	}
	e := logs.All()[0]
	f := e.ContextMap()
	for k, want := range map[string]any{
		"src.addr": "10.0.0.1:40000", "dst.addr": "10.0.1.2:15008", "dst.hbone_addr": "10.0.1.2:8080",
		"src.identity": "spiffe://cluster.local/ns/apps/sa/client", "dst.identity": "spiffe://cluster.local/ns/apps/sa/server",
		"direction": "inbound", "bytes_sent": int64(100), "bytes_recv": int64(7), "reason": "policy_denied",
		"dst.service": "server.apps.svc.cluster.local",
	} {
		if fmt.Sprint(f[k]) != fmt.Sprint(want) {
			t.Errorf("log field %s = %v, want %v", k, f[k], want)
		}
	}
	if e.Level != zap.ErrorLevel {
		t.Errorf("denied connection logged at %v", e.Level)
	}
	const want = `
# HELP istio_tcp_connections_closed_total The total number of TCP connections closed.
# TYPE istio_tcp_connections_closed_total counter
istio_tcp_connections_closed_total{connection_security_policy="mutual_tls",destination_app="unknown",destination_canonical_revision="unknown",destination_canonical_service="unknown",destination_cluster="unknown",destination_principal="spiffe://cluster.local/ns/apps/sa/server",destination_region="unknown",destination_service="server.apps.svc.cluster.local",destination_service_name="server",destination_service_namespace="apps",destination_version="unknown",destination_workload="server",destination_workload_namespace="apps",destination_zone="z1",reporter="destination",request_protocol="tcp",response_flags="DENY",source_app="unknown",source_canonical_revision="unknown",source_canonical_service="unknown",source_cluster="unknown",source_principal="spiffe://cluster.local/ns/apps/sa/client",source_region="unknown",source_version="unknown",source_workload="client",source_workload_namespace="apps",source_zone="unknown"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "istio_tcp_connections_closed_total"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.received); got != 100 {
		t.Fatalf("received bytes = %v, want 100 (request direction)", got)
	}
	if got := testutil.ToFloat64(m.sent); got != 7 {
		t.Fatalf("sent bytes = %v, want 7 (response direction)", got)
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("destination")); got != 0 {
		t.Fatalf("sockets open gauge = %v after close", got)
	}
	if o := m.Open(); o != 0 {
		t.Fatalf("Open() = %d after close", o)
	}
}

func TestReasonMapping(t *testing.T) {
	tests := []struct {
		err  error
		want Reason
		flag string
	}{
		{nil, ReasonNone, "-"},
		{WithReason(ReasonConnectFailed, errors.New("refused")), ReasonConnectFailed, "CONNECT"},
		{fmt.Errorf("outer: %w", WithReason(ReasonTLSFailure, errors.New("bad cert"))), ReasonTLSFailure, "TLS_FAILURE"},
		{ErrForced, ReasonDrained, "-"},
		{fmt.Errorf("hbone: connection closed: %w", hbone.ErrRevoked), ReasonRevoked, "CERT_REVOKED"},
		{errors.New("mystery"), ReasonInternal, "CONNECT"},
	}
	for _, tt := range tests {
		if got := ReasonOf(tt.err); got != tt.want || got.responseFlag() != tt.flag {
			t.Errorf("ReasonOf(%v) = %q/%q, want %q/%q", tt.err, got, got.responseFlag(), tt.want, tt.flag)
		}
	}
}
