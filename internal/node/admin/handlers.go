package admin

import (
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/node/configdump"
	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod/inpodstate"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// StateSource is where the config dump reads the mesh state
// (*state.Store).
type StateSource interface {
	Load() *state.Snapshot
}

// Dumper assembles /config_dump in Istio's ztunnel shape (package
// configdump). State is required; every other field may be nil/empty and
// its section is then empty or left out.
type Dumper struct {
	State StateSource
	// Certs reports certificate state (certmanager.Manager.Dump).
	Certs func() []certmanager.CertDump
	// Pods reports the pod proxies (inpod.Manager.Dump) for workloadState.
	Pods func() inpodstate.Dump
	// Connections lists the open connections, attributed to the pod
	// proxies in workloadState.
	Connections func() []configdump.Connection
	// Network is the node's network, where a connection's local IP is
	// looked up to find its pod.
	Network string
	// TrustDomain is shown in each workloadState entry's info.
	TrustDomain string
	// Config is the static configuration shown under "config"
	// (*config.Config).
	Config any
	// Version is shown under "version".
	Version string
	// Sections are extra top-level sections by name. A name that collides
	// with a built-in section is ignored.
	Sections map[string]func() any
}

// Top-level keys of the config dump (Istio ztunnel's names where they
// exist).
const (
	KeyGeneration    = "generation"
	KeyWorkloads     = "workloads"
	KeyServices      = "services"
	KeyPolicies      = "policies"
	KeyCertificates  = "certificates"
	KeyConfig        = "config"
	KeyVersion       = "version"
	KeyWorkloadState = "workloadState"
	KeyPodProxies    = "podProxies"
)

// Build returns the dump as a JSON object: generation, workloads, services
// (with their endpoints) and policies of one snapshot, certificates,
// workloadState, config, version and the extra sections.
func (d *Dumper) Build() map[string]any {
	snap := d.State.Load()
	wls, svcs, pols := configdump.FromSnapshot(snap)
	out := map[string]any{
		KeyGeneration: snap.Generation,
		KeyWorkloads:  wls,
		KeyServices:   svcs,
		KeyPolicies:   pols,
	}
	var certs []certmanager.CertDump
	if d.Certs != nil {
		certs = d.Certs()
	}
	out[KeyCertificates] = certificates(certs)
	ws := map[string]configdump.WorkloadState{}
	if d.Pods != nil {
		var conns []configdump.Connection
		if d.Connections != nil {
			conns = d.Connections()
		}
		var pp *configdump.PodProxies
		ws, pp = configdump.WorkloadStates(d.Pods(), conns, snap, d.Network, d.TrustDomain)
		out[KeyPodProxies] = pp
	}
	out[KeyWorkloadState] = ws
	if d.Config != nil {
		out[KeyConfig] = d.Config
	}
	if d.Version != "" {
		out[KeyVersion] = d.Version
	}
	for name, f := range d.Sections {
		if _, taken := out[name]; !taken && f != nil {
			out[name] = f()
		}
	}
	return out
}

func certificates(in []certmanager.CertDump) []configdump.Certificate {
	out := make([]configdump.Certificate, 0, len(in))
	conv := func(cs []certmanager.CertInfo) []configdump.CertInfo {
		o := make([]configdump.CertInfo, 0, len(cs))
		for _, c := range cs {
			o = append(o, configdump.CertInfo(c))
		}
		return o
	}
	for _, c := range in {
		out = append(out, configdump.Certificate{Identity: c.Identity, State: c.State, CertChain: conv(c.CertChain),
			RootCerts: conv(c.RootCerts), LastError: c.LastError, NextRefresh: c.NextRefresh})
	}
	return out
}

// AdminHandler serves the localhost admin endpoints.
func AdminHandler(deps Deps) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /config_dump", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(deps.Dump.Build()); err != nil {
			deps.logger().Warn("writing config dump", zap.Error(err))
		}
	})
	mux.HandleFunc("GET /connections", func(w http.ResponseWriter, r *http.Request) {
		if deps.Connections == nil {
			http.Error(w, "connections not available", http.StatusNotImplemented)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"connections": deps.Connections()}); err != nil {
			deps.logger().Warn("writing connections", zap.Error(err))
		}
	})
	daemon.DebugHandlers(mux, deps.Level)
	var once sync.Once
	mux.HandleFunc("/quitquitquit", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "use POST", http.StatusMethodNotAllowed)
			return
		}
		if deps.Shutdown == nil {
			http.Error(w, "shutdown not available", http.StatusNotImplemented)
			return
		}
		once.Do(func() { go deps.Shutdown() })
		fmt.Fprintln(w, "shutdown now")
	})
	mux.HandleFunc("GET /{$}", index)
	return mux
}

func (d Deps) logger() *zap.Logger {
	if d.Log == nil {
		return zap.NewNop()
	}
	return d.Log
}

// StatsHandler serves Prometheus metrics from g on /metrics and
// /stats/prometheus.
func StatsHandler(g prometheus.Gatherer, log *zap.Logger) http.Handler {
	h := promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:      zap.NewStdLog(log.Named("metrics")),
		ErrorHandling: promhttp.ContinueOnError,
	})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	mux.Handle("GET /stats/prometheus", h)
	return mux
}

func index(w http.ResponseWriter, _ *http.Request) {
	links := [...][2]string{
		{"config_dump", "workloads, services, policies, certificates and pod proxies"},
		{"connections", "open connections: peers, identities, bytes so far"},
		{"logging", "log level (POST ?level=debug to change)"},
		{"debug/pprof/", "profiles"},
		{"quitquitquit", "graceful shutdown (POST)"},
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprint(w, "<html><head><title>ztunnel-go admin</title></head><body><h1>ztunnel-go admin</h1><ul>\n")
	for _, l := range links {
		fmt.Fprintf(w, "<li><a href=\"/%s\">/%s</a>: %s</li>\n", l[0], l[0], html.EscapeString(l[1]))
	}
	fmt.Fprint(w, "</ul></body></html>\n")
}
