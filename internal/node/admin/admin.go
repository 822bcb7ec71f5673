// Package admin is the node proxy's operator surface, three HTTP servers as
// Istio's ztunnel has them (docs/protocol.md#ports): the admin server on
// localhost only (/config_dump, /connections, /logging, /quitquitquit, /debug/pprof/, an
// HTML index), Prometheus metrics (/metrics and /stats/prometheus) from an
// injected registry, and readiness (/healthz/ready, daemon.Readiness) gated
// on named tasks. The servers, /logging and the profiles are internal/daemon's,
// shared with the other daemons.
//
// It is not a source of truth: every section of the config dump, the
// metrics registry, the log level and the shutdown trigger are injected.
package admin

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

// Config says where the servers listen (config.Config's AdminAddr,
// StatsAddr and ReadinessAddr). An empty address disables that server.
type Config struct {
	// AdminAddr must be on loopback ("localhost:15000", "127.0.0.1:15000",
	// "[::1]:15000"): the admin server can shut the proxy down and change
	// its log level. "localhost" binds both 127.0.0.1 and, when the host has
	// it, ::1.
	AdminAddr string
	// StatsAddr serves Prometheus metrics; "[::]:port" falls back to
	// 0.0.0.0 when the host has no IPv6.
	StatsAddr string
	// ReadinessAddr serves /healthz/ready; same fallback as StatsAddr.
	ReadinessAddr string
	// StatsTLS, when set, serves the metrics over HTTPS only
	// (daemon.KeyPairFile.TLSConfig); nil serves plain HTTP.
	StatsTLS *tls.Config
}

// Deps are what the servers expose.
type Deps struct {
	// Log receives server errors; nil means none.
	Log *zap.Logger
	// Level is the process's log level, read and changed by /logging.
	// Required.
	Level zap.AtomicLevel
	// Gatherer is scraped by /metrics and /stats/prometheus (a
	// prometheus.Registry; never the default one). Required.
	Gatherer prometheus.Gatherer
	// Dump builds the /config_dump sections. Required.
	Dump *Dumper
	// Readiness gates /healthz/ready. Required.
	Readiness *daemon.Readiness
	// Shutdown is called (once, asynchronously) by POST /quitquitquit. nil
	// disables the endpoint (501).
	Shutdown func()
	// Connections lists the open connections for GET /connections
	// (proxy.Metrics.Connections). nil disables the endpoint (501).
	Connections func() any
}

// Server is the three HTTP servers. Create with Listen (which binds, so
// that a port conflict is reported at start), then Serve.
type Server struct {
	*daemon.Servers
}

// Listen binds every configured server and returns a Server ready to Serve.
// On error nothing stays bound. The admin server is a daemon.Debug server
// (loopback only); stats and readiness are daemon.Public.
func Listen(cfg Config, deps Deps) (*Server, error) {
	if deps.Gatherer == nil || deps.Dump == nil || deps.Readiness == nil {
		return nil, errors.New("admin: Deps.Gatherer, Dump and Readiness are required")
	}
	log := deps.logger()
	s, err := daemon.Listen(log,
		daemon.Spec{Name: "admin", Addr: cfg.AdminAddr, Exposure: daemon.Debug, Handler: AdminHandler(deps)},
		daemon.Spec{Name: "stats", Addr: cfg.StatsAddr, Exposure: daemon.Public, Handler: StatsHandler(deps.Gatherer, log), TLS: cfg.StatsTLS},
		daemon.Spec{Name: "readiness", Addr: cfg.ReadinessAddr, Exposure: daemon.Public, Handler: deps.Readiness},
	)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	return &Server{s}, nil
}

// Addrs returns the bound addresses of server "admin", "stats" or
// "readiness" (useful with port 0).
func (s *Server) Addrs(name string) []net.Addr { return s.Servers.Addrs(name) }

// NewRegistry returns a fresh registry with the Go runtime and process
// collectors, for the node proxy's metrics (never the default registry).
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
