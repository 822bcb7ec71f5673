// Package admin is the node proxy's operator surface, three HTTP servers as
// Istio's ztunnel has them (ambient-protocol.md §2): the admin server on
// localhost only (/config_dump, /logging, /quitquitquit, /debug/pprof/, an
// HTML index), Prometheus metrics (/metrics and /stats/prometheus) from an
// injected registry, and readiness (/healthz/ready) gated on named tasks.
//
// It is not a source of truth: every section of the config dump, the
// metrics registry, the log level and the shutdown trigger are injected.
package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
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
	Readiness *Readiness
	// Shutdown is called (once, asynchronously) by POST /quitquitquit. nil
	// disables the endpoint (501).
	Shutdown func()
}

// Server is the three HTTP servers. Create with Listen (which binds, so
// that a port conflict is reported at start), then Serve.
type Server struct {
	log      *zap.Logger
	servers  []*http.Server
	bindings []binding
	addrs    map[string][]net.Addr
}

type binding struct {
	hs *http.Server
	l  net.Listener
}

// Listen binds every configured server and returns a Server ready to Serve.
// On error nothing stays bound.
func Listen(cfg Config, deps Deps) (_ *Server, err error) {
	if deps.Gatherer == nil || deps.Dump == nil || deps.Readiness == nil {
		return nil, errors.New("admin: Deps.Gatherer, Dump and Readiness are required")
	}
	log := deps.Log
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{log: log, addrs: map[string][]net.Addr{}}
	defer func() {
		if err != nil {
			for _, b := range s.bindings {
				b.l.Close()
			}
		}
	}()
	for _, srv := range []struct {
		name, addr string
		loopback   bool
		h          http.Handler
	}{
		{"admin", cfg.AdminAddr, true, AdminHandler(deps)},
		{"stats", cfg.StatsAddr, false, StatsHandler(deps.Gatherer, log)},
		{"readiness", cfg.ReadinessAddr, false, deps.Readiness},
	} {
		if srv.addr == "" {
			continue
		}
		ls, err := listen(srv.addr, srv.loopback)
		if err != nil {
			return nil, fmt.Errorf("admin: %s server: %w", srv.name, err)
		}
		hs := &http.Server{
			Handler:           srv.h,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          zap.NewStdLog(log.Named(srv.name)),
		}
		s.servers = append(s.servers, hs)
		for _, l := range ls {
			s.bindings = append(s.bindings, binding{hs, l})
			s.addrs[srv.name] = append(s.addrs[srv.name], l.Addr())
		}
	}
	return s, nil
}

// Addrs returns the bound addresses of server "admin", "stats" or
// "readiness" (useful with port 0).
func (s *Server) Addrs(name string) []net.Addr { return s.addrs[name] }

// Serve serves until ctx is done, then shuts the servers down (waiting up
// to 5 s for in-flight requests) and returns nil.
func (s *Server) Serve(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, b := range s.bindings {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.hs.Serve(b.l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("admin listener failed", zap.Stringer("addr", b.l.Addr()), zap.Error(err))
			}
		}()
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, hs := range s.servers {
		_ = hs.Shutdown(sctx)
	}
	wg.Wait()
	return nil
}

// listen binds addr. With loopback, a non-loopback host is refused.
// "localhost" binds 127.0.0.1 and (best effort) ::1; "[::]" falls back to
// 0.0.0.0 without IPv6.
func listen(addr string, loopback bool) ([]net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", addr, err)
	}
	if host == "localhost" {
		l4, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			return nil, err
		}
		ls := []net.Listener{l4}
		p := port
		if p == "0" { // bind ::1 on the same port as 127.0.0.1
			p = fmt.Sprint(l4.Addr().(*net.TCPAddr).Port)
		}
		if l6, err := net.Listen("tcp6", net.JoinHostPort("::1", p)); err == nil {
			ls = append(ls, l6)
		}
		return ls, nil
	}
	ip, err := netip.ParseAddr(host)
	if host != "" && err != nil {
		return nil, fmt.Errorf("address %q: host must be an IP or localhost", addr)
	}
	if loopback && (host == "" || !ip.IsLoopback()) {
		return nil, fmt.Errorf("address %q: the admin server binds loopback only", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil && ip == netip.IPv6Unspecified() {
		l, err = net.Listen("tcp4", net.JoinHostPort("0.0.0.0", port))
	}
	if err != nil {
		return nil, err
	}
	return []net.Listener{l}, nil
}

// Close closes every listener and server at once (when Serve was never
// called, or to abort).
func (s *Server) Close() error {
	var errs []error
	for _, b := range s.bindings {
		if err := b.l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for _, hs := range s.servers {
		errs = append(errs, hs.Close())
	}
	return errors.Join(errs...)
}

// NewRegistry returns a fresh registry with the Go runtime and process
// collectors, for the node proxy's metrics (never the default registry).
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
