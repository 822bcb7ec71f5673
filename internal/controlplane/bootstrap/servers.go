package bootstrap

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/xdsserver"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// SyncStatus is the body of the debug server's /debug/syncz: every
// connected xDS stream (node proxies and waypoints) and its sync state.
type SyncStatus struct {
	Streams []xds.StreamStatus `json:"streams"`
}

// ConfigDumper is what the debug server's /config_dump and /debug/syncz
// show (*controlplane.ControlPlane).
type ConfigDumper interface {
	ConfigDump() controlplane.ConfigDump
	XDS() *xdsserver.Server
}

// Servers are the control plane's HTTP servers at o's addresses:
//
//   - admin (daemon.Debug, loopback only): /config_dump (translation,
//     warnings, allocations: nothing the network may read), /debug/syncz
//     (each connected proxy's xDS sync state per type, what zctl status
//     prints), /metrics, /logging and /debug/pprof/;
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
	admin.HandleFunc("GET /debug/syncz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(SyncStatus{Streams: cp.XDS().Status()})
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
