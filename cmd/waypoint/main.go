// Command waypoint is ztunnel-go's L7 waypoint: one per waypoint Gateway
// (gatewayClassName istio-waypoint). With --mode east-west (env
// GATEWAY_MODE) it is instead an east-west gateway, one per Gateway of
// class istio-east-west (proxy/eastwest), forwarding double HBONE from
// other networks to --network (env NETWORK); the rest is shared.
//
// It connects to the control plane's delta xDS (the workload API, plus
// a waypoint's own config), obtains its
// certificate from the mesh CA (both verified against --root-cert, reloaded
// when the file changes), and serves HBONE on 15008 (see
// proxy/waypoint). Readiness (/healthz/ready on 15021) holds until the first
// xDS sync and the first certificate; SIGTERM drains: new tunnels are
// refused, open ones get --drain-duration to finish.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/procs"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry/tracing"
)

// defaultTracing is the tracing of --tracing-endpoint (nil: none).
func defaultTracing(o *options) *tracing.Config {
	if o.TraceEndpoint == "" {
		return nil
	}
	p := &tracing.Provider{Name: "bootstrap", Endpoint: o.TraceEndpoint}
	if o.TraceProtocol == "http" {
		p.Protocol = tracing.HTTP
	}
	return &tracing.Config{Provider: p, RandomSamplingPercentage: o.TraceSampling, UseRequestID: true}
}

const name = "waypoint"

func main() {
	daemon.HeapProfileOff(os.Getenv("GODEBUG"))
	o, err := parseFlags(os.Args[1:])
	daemon.ExitOnFlagError(name, err)
	if o.CheckFlags {
		if err := daemon.PrintCheck(os.Stdout, o); err != nil {
			os.Exit(1)
		}
		return
	}
	lc, _ := o.log.Config()
	// One lock for both logs' writes to standard error, so the access
	// log's large writes never interleave with the main log's lines.
	lc.Output = zapcore.Lock(os.Stderr)
	log, level, err := daemon.NewLogger(lc)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	ctx, stop := daemon.SignalContext()
	defer stop()
	daemon.Exit(log, name, run(ctx, o, lc, log, level))
}

func run(ctx context.Context, o *options, lc daemon.LogConfig, log *zap.Logger, level zap.AtomicLevel) error {
	out, ok := lc.Output.(zapcore.WriteSyncer)
	if !ok {
		out = zapcore.Lock(os.Stderr)
	}
	access, err := accessLogger(lc, level, out)
	if err != nil {
		return err
	}
	defer access.stop()
	ns, gw, _ := strings.Cut(o.Gateway, "/")
	id := identity.MustNew(o.TrustDomain, ns, o.ServiceAccount)
	ip := netip.MustParseAddr(o.IP)
	up, err := newUpstream(o, log)
	if err != nil {
		return err
	}
	// Every goroutine of the waypoint is a task of g, stopped in the reverse
	// order of its start: the HBONE listener drains first, while xDS,
	// certificates and the admin servers still serve it.
	g := daemon.NewGroup(ctx, log)
	defer func() { g.Stop(); _ = g.Wait() }() // an early error return stops the tasks started so far
	retries := backoff.NewSet(log)
	g.Readiness().ShowRetries(retries)
	if o.AdaptiveProcs {
		g.Go("procs", func(ctx context.Context) error { procs.Run(ctx, procs.Config{}, log.Named("procs")); return nil }, daemon.Once())
	}
	g.Go("root certificate watcher", func(ctx context.Context) error { up.watch(ctx, 0); return nil })
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	req, err := certmanager.NewGRPCRequester(up.ca)
	if err != nil {
		return err
	}
	defer req.Close()
	certs, err := certmanager.New(certmanager.Config{}, certmanager.Deps{Requester: req, Logger: log.Named("certs")})
	if err != nil {
		return err
	}
	defer certs.Close()
	revocation, err := newRevocation(o, log.Named("crl"), reg)
	if err != nil {
		return err
	}
	if revocation != nil {
		g.Go("crl", revocation.Run)
	}
	dp, closeDP, err := newDataPlane(o, id, ip, certs, revocationOf(revocation), log, access, reg)
	if err != nil {
		return err
	}
	defer closeDP()
	xcfg := up.xds
	xcfg.Node = xds.NodeInfo{PodName: o.PodName, PodNamespace: ns, NodeName: o.NodeName, InstanceIPs: []string{ip.String()},
		Metadata: map[string]string{"ISTIO_VERSION": daemon.Version()}} // zctl status shows it
	xcfg.Sink, xcfg.Waypoint, xcfg.Log, xcfg.Registerer = dp.sink, dp.waypoint, log.Named("xds"), reg
	xcfg.Retry = func(p backoff.Policy) *backoff.Retry { return retries.New("xds", p) }
	xc, err := xds.NewClient(xcfg)
	if err != nil {
		return err
	}
	g.Go("xds", xc.Run, daemon.ReadyWhen(daemon.Closed(xc.Synced())))
	certReady := make(chan struct{})
	certRetry := retries.New("certificate", backoff.Policy{})
	g.Go("certificate", func(ctx context.Context) error {
		if waitCertificate(ctx, certs, id, certRetry) {
			close(certReady)
		}
		return nil
	}, daemon.Once(), daemon.ReadyWhen(daemon.Closed(certReady)))
	admin := http.NewServeMux()
	daemon.DebugHandlers(admin, level)
	admin.HandleFunc("/config_dump", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write(dp.dump())
	})
	// The retry loops' state: the xDS dump above is the control plane's
	// config as received, so this is its own page.
	admin.HandleFunc("/retries", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(retries.Status())
	})
	if revocation != nil {
		admin.HandleFunc("/crl", func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(rw).Encode(revocation.Dump())
		})
	}
	servers, err := daemon.Listen(log,
		daemon.Spec{Name: "metrics", Addr: o.MetricsAddr, Exposure: daemon.Public, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})},
		daemon.Spec{Name: "readiness", Addr: o.ReadinessAddr, Exposure: daemon.Public, Handler: g.Readiness()},
		daemon.Spec{Name: "admin", Addr: o.AdminAddr, Handler: admin},
	)
	if err != nil {
		return err
	}
	g.Go("http servers", servers.Serve)

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.Listen, err)
	}
	g.Go("hbone", func(context.Context) error {
		if err := dp.serve(ln); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, hbone.ErrServerClosed) {
			return err
		}
		return nil
	}, daemon.OnStop(func() {
		log.Info("draining", zap.Duration("drain_duration", o.DrainDuration))
		dctx, dcancel := context.WithTimeout(context.Background(), o.DrainDuration)
		defer dcancel()
		if err := dp.shutdown(dctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			log.Warn("drain ended with an error", zap.Error(err))
		}
	}))
	log.Info(o.Mode+" serving", zap.String("gateway", o.Gateway), zap.String("network", o.Network), zap.Stringer("identity", id),
		zap.String("listen", ln.Addr().String()), zap.String("name", gw))
	return g.Wait()
}

// waitCertificate fetches id's certificate until it has one, and reports
// whether it got it before ctx ended. While the CA refuses, certs fails at
// once (its manager retries on its own schedule), so each failure waits out
// retry's backoff, which logs once per backoff step, not once per attempt.
func waitCertificate(ctx context.Context, certs identity.CertSource, id identity.Identity, retry *backoff.Retry) bool {
	for {
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := certs.Fetch(fctx, id)
		cancel()
		if err == nil {
			retry.Succeeded()
			return true
		}
		if ctx.Err() != nil || retry.Wait(ctx, err) != nil {
			return false
		}
	}
}
