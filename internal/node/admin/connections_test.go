package admin

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel-go/proxy"
)

// TestConnectionsEndpoint: GET /connections lists what the proxy's Metrics
// hold open; without a source it answers 501, and it only takes GET.
func TestConnectionsEndpoint(t *testing.T) {
	deps, _ := testDeps(t)
	m := proxy.NewMetrics(prometheus.NewRegistry())
	r := proxy.NewResult(m, nil, proxy.Inbound, netip.MustParseAddrPort("10.0.0.9:41000"), netip.MustParseAddrPort("10.0.0.1:8080"))
	r.Dst = proxy.Peer{Workload: "server", Namespace: "demo"}
	r.Opened()
	defer r.Record(nil)
	deps.Connections = func() any { return m.Connections() }
	h := AdminHandler(deps)
	code, body := do(t, h, "GET", "/connections")
	if code != 200 {
		t.Fatalf("GET /connections = %d %s", code, body)
	}
	var got struct{ Connections []proxy.Connection }
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Connections) != 1 || got.Connections[0].Src.Addr != "10.0.0.9:41000" || got.Connections[0].Dst.Workload != "server" {
		t.Errorf("connections: %s", body)
	}
	if code, _ := do(t, h, "POST", "/connections"); code != 405 {
		t.Errorf("POST /connections = %d, want 405", code)
	}
	if _, body := do(t, h, "GET", "/"); !strings.Contains(body, "/connections") {
		t.Error("index does not link /connections")
	}
	deps.Connections = nil
	if code, _ := do(t, AdminHandler(deps), "GET", "/connections"); code != 501 {
		t.Errorf("without a source: %d, want 501", code)
	}
}
