package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// StateSource is where the config dump reads the mesh state
// (*state.Store).
type StateSource interface {
	Load() *state.Snapshot
}

// Dumper assembles /config_dump. State is required; every other field may
// be nil/empty and is then left out (Certs: an empty list).
type Dumper struct {
	State StateSource
	// Certs reports certificate state (certmanager.Manager.Dump).
	Certs func() []certmanager.CertDump
	// Config is the static configuration shown under "config"
	// (*config.Config).
	Config any
	// Version is shown under "version".
	Version string
	// Sections are extra top-level sections by name, e.g. "workloadState"
	// (inpod.Manager.Dump). A name that collides with a built-in section is
	// ignored.
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
)

// Build returns the dump as a JSON object: generation, workloads, services
// and policies of one snapshot, certificates, config, version and the extra
// sections.
func (d *Dumper) Build() map[string]any {
	snap := d.State.Load().Dump()
	out := map[string]any{
		KeyGeneration: snap.Generation,
		KeyWorkloads:  orEmpty(snap.Workloads),
		KeyServices:   orEmpty(snap.Services),
		KeyPolicies:   orEmpty(snap.Policies),
	}
	var certs []certmanager.CertDump
	if d.Certs != nil {
		certs = d.Certs()
	}
	out[KeyCertificates] = orEmpty(certs)
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

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
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
	lg := &logging{level: deps.Level, initial: deps.Level.Level()}
	mux.Handle("/logging", lg)
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
	mux.HandleFunc("GET /debug/pprof/", pprofIndex)
	mux.HandleFunc("GET /debug/pprof/profile", pprofCPU)
	mux.HandleFunc("GET /debug/pprof/{name}", pprofNamed)
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

// logging serves /logging: GET shows the level; POST ?level=<lvl> sets it,
// POST ?reset restores the level the process started with. Changing state
// takes POST (as in Istio's ztunnel and Envoy), so a browser cannot change
// it by following a link.
type logging struct {
	level   zap.AtomicLevel
	initial zapcore.Level
}

func (l *logging) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if q.Has("level") || q.Has("reset") {
			w.Header().Set("Allow", "GET, POST")
			http.Error(w, "changing the log level takes POST", http.StatusMethodNotAllowed)
			return
		}
	case http.MethodPost:
		switch {
		case q.Has("reset"):
			l.level.SetLevel(l.initial)
		case q.Has("level"):
			var lvl zapcore.Level
			if err := lvl.UnmarshalText([]byte(q.Get("level"))); err != nil {
				http.Error(w, fmt.Sprintf("invalid level %q: want debug, info, warn or error", q.Get("level")), http.StatusBadRequest)
				return
			}
			l.level.SetLevel(lvl)
		default:
			http.Error(w, "POST /logging?level=<debug|info|warn|error> or /logging?reset", http.StatusBadRequest)
			return
		}
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "use GET or POST", http.StatusMethodNotAllowed)
		return
	}
	fmt.Fprintf(w, "current log level is %s\n", l.level.Level())
}

func pprofIndex(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/debug/pprof/" {
		http.NotFound(w, r)
		return
	}
	var b strings.Builder
	b.WriteString("<html><body><h1>profiles</h1><ul>\n")
	b.WriteString(`<li><a href="profile?seconds=10">profile</a> (CPU, 10 s)</li>` + "\n")
	profiles := pprof.Profiles()
	sort.Slice(profiles, func(i, j int) bool { return profiles[i].Name() < profiles[j].Name() })
	for _, p := range profiles {
		n := html.EscapeString(p.Name())
		fmt.Fprintf(&b, "<li><a href=\"%s?debug=1\">%s</a> (%d)</li>\n", n, n, p.Count())
	}
	b.WriteString("</ul></body></html>\n")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprint(w, b.String())
}

func pprofNamed(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	p := pprof.Lookup(name)
	if p == nil {
		http.Error(w, fmt.Sprintf("unknown profile %q", name), http.StatusNotFound)
		return
	}
	debug, _ := strconv.Atoi(r.URL.Query().Get("debug"))
	if debug > 0 {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name))
	}
	_ = p.WriteTo(w, debug)
}

// pprofCPU records a CPU profile for ?seconds= (default 10, at most 300).
func pprofCPU(w http.ResponseWriter, r *http.Request) {
	secs, err := strconv.Atoi(r.URL.Query().Get("seconds"))
	if err != nil || secs <= 0 {
		secs = 10
	}
	secs = min(secs, 300)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="profile"`)
	if err := pprof.StartCPUProfile(w); err != nil {
		w.Header().Del("Content-Disposition")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		http.Error(w, "cpu profile: "+err.Error(), http.StatusConflict)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(secs)*time.Second)
	defer cancel()
	<-ctx.Done()
	pprof.StopCPUProfile()
}

func index(w http.ResponseWriter, _ *http.Request) {
	links := [...][2]string{
		{"config_dump", "workloads, services, policies, certificates and pod proxies"},
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
