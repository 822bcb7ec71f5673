package bootstrap

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

// ConfigDumper is what the debug server's /config_dump shows
// (*controlplane.ControlPlane).
type ConfigDumper interface {
	ConfigDump() controlplane.ConfigDump
}

// Servers are the control plane's HTTP servers at o's addresses:
//
//   - admin (daemon.Debug, loopback only): /config_dump (translation,
//     warnings, allocations: nothing the network may read), /metrics,
//     /logging and /debug/pprof/;
//   - metrics (daemon.Public): /metrics only;
//   - readiness (daemon.Public): /healthz/ready only.
func Servers(o Options, cp ConfigDumper, g prometheus.Gatherer, level zap.AtomicLevel, ready *daemon.Readiness) []daemon.Spec {
	metrics := promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	admin := http.NewServeMux()
	admin.HandleFunc("GET /config_dump", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(cp.ConfigDump())
	})
	admin.Handle("GET /metrics", metrics)
	daemon.DebugHandlers(admin, level)
	public := http.NewServeMux()
	public.Handle("GET /metrics", metrics)
	return []daemon.Spec{
		{Name: "admin", Addr: o.AdminAddr, Exposure: daemon.Debug, Handler: admin},
		{Name: "metrics", Addr: o.MetricsAddr, Exposure: daemon.Public, Handler: public},
		{Name: "readiness", Addr: o.ReadinessAddr, Exposure: daemon.Public, Handler: ready},
	}
}
