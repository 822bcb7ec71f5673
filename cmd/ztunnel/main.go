// Command ztunnel is ztunnel-go's node proxy: it takes the pods the node
// agent hands it over ZDS and runs their in-pod listeners, with state from
// xDS and certificates from the CA. Configuration comes from Istio's
// ztunnel environment variables (internal/node/config).
//
// It embeds no control plane (and links none of it: no Kubernetes or
// Istio API types). For a mesh without Kubernetes, run ztunnel-cp in local
// mode beside it, as `make demo` does:
//
//	ztunnel-cp --config-dir DIR --node-tokens FILE --state-dir S   # FILE: "<node> <token>" lines
//	NODE_NAME=n1 XDS_ADDRESS=127.0.0.1:15012 XDS_ROOT_CA=S/root-cert.pem \
//	  CA_ROOT_CA=S/root-cert.pem AUTH_TOKEN=<file holding n1's token> ztunnel
//
// Wiring only; the logic lives in the packages it connects.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"os"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/cni/zds"
	"github.com/ztunnel-go/ztunnel-go/dnsproxy"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
	"github.com/ztunnel-go/ztunnel-go/internal/node/admin"
	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/configdump"
	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
	"github.com/ztunnel-go/ztunnel-go/proxy"
)

func main() {
	daemon.HeapProfileOff(os.Getenv("GODEBUG"))
	cfg, err := parseConfig(os.Args[1:], os.LookupEnv, os.Environ(), os.Stderr)
	daemon.ExitOnFlagError("ztunnel", err)
	log, level, err := daemon.NewLogger(daemon.LogConfig{Level: cfg.LogLevel, Format: cfg.LogFormat})
	daemon.ExitOnFlagError("ztunnel", err)
	ctx, stop := daemon.SignalContext()
	defer stop()
	daemon.Exit(log, "ztunnel", run(ctx, cfg, log, level))
}

// parseConfig reads the flags (args without the program name) and the
// environment. The environment configures the node proxy, as Istio's
// ztunnel; the daemons' shared --log-level and --log-format, when given,
// win over LOG_LEVEL/RUST_LOG and LOG_FORMAT.
func parseConfig(args []string, lookup config.Lookup, environ []string, stderr io.Writer) (*config.Config, error) {
	fs := flag.NewFlagSet("ztunnel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	localDir := fs.String(removedLocalConfig, "", "removed: run `ztunnel-cp --config-dir DIR` beside the node proxy and point XDS_ADDRESS at it")
	var logFlags daemon.LogFlags
	logFlags.Register(fs, "", "")
	version := daemon.VersionFlag(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *version {
		return nil, daemon.ErrVersion
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *localDir != "" {
		return nil, localConfigRemoved(*localDir)
	}
	if _, err := logFlags.Config(); err != nil {
		return nil, err
	}
	overrides := map[string]string{}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case daemon.FlagLogLevel:
			overrides[config.EnvLogLevel] = logFlags.Level
		case daemon.FlagLogFormat:
			overrides[config.EnvLogFormat] = logFlags.Format
		}
	})
	return config.Parse(func(k string) (string, bool) {
		if v, ok := overrides[k]; ok {
			return v, true
		}
		return lookup(k)
	}, environ)
}

// removedLocalConfig is the flag that once embedded the control plane in
// the node proxy. It is still parsed so that old command lines fail with
// directions rather than "flag provided but not defined".
const removedLocalConfig = "local-config"

// localConfigRemoved tells a --local-config user how to get the same mesh
// with two processes.
func localConfigRemoved(dir string) error {
	return fmt.Errorf("--%s was removed: the node proxy no longer embeds the control plane. Run it beside ztunnel: "+
		"`ztunnel-cp --config-dir %s --node-tokens FILE --state-dir STATE` (FILE holds \"<node-name> <token>\" lines), "+
		"then start ztunnel with XDS_ADDRESS=127.0.0.1:15012, XDS_ROOT_CA=STATE/root-cert.pem, "+
		"CA_ROOT_CA=STATE/root-cert.pem and AUTH_TOKEN=<file holding this node's token>", removedLocalConfig, dir)
}

// dumpKeyRetries is the config dump's section listing every retry loop's
// state (backoff.Status), failing or not.
const dumpKeyRetries = "retries"

// run serves until ctx is done (SIGTERM) or /quitquitquit, then drains the
// pods' listeners and stops.
func run(ctx context.Context, cfg *config.Config, log *zap.Logger, level zap.AtomicLevel) error {
	log.Info("starting ztunnel-go", zap.String("version", daemon.Version()), zap.Any("config", cfg))
	reg := admin.NewRegistry()
	// Every goroutine is a task of g, stopped in the reverse order of its
	// start: the node agent's link and the pods' listeners first, while
	// xDS, certificates and the admin servers still serve the draining
	// connections. The first task error stops the rest.
	g := daemon.NewGroup(ctx, log)
	defer func() { g.Stop(); _ = g.Wait() }() // an early error return stops the tasks started so far
	retries := backoff.NewSet(log)
	g.Readiness().ShowRetries(retries)

	up, err := remoteUpstream(cfg, log.Named("roots"))
	if err != nil {
		return err
	}
	if up.watch != nil {
		g.Go("root certificate watcher", up.watch)
	}
	store := state.NewStore()
	xcfg := up.xdsConfig(cfg, store)
	xcfg.Log, xcfg.Registerer = log.Named("xds"), reg
	xcfg.Retry = func(p backoff.Policy) *backoff.Retry { return retries.New("xds", p) }
	xc, err := xds.NewClient(xcfg)
	if err != nil {
		return err
	}
	g.Go(admin.TaskStateManager, xc.Run, daemon.ReadyWhen(daemon.Closed(xc.Synced())))
	req, err := certmanager.NewGRPCRequester(up.caConfig(cfg))
	if err != nil {
		return err
	}
	defer req.Close()
	certs, err := certmanager.New(certmanager.Config{}, certmanager.Deps{Requester: req, Logger: log.Named("certs"), Metrics: reg})
	if err != nil {
		return err
	}
	defer certs.Close()
	g.Go("certificate watcher", func(ctx context.Context) error {
		watchWanted(ctx, store, cfg.NodeName, certs.SetWanted)
		return nil
	})
	rev, err := newRevocation(cfg, log.Named("crl"), reg) // CRL_PATH; nil when unset
	if err != nil {
		return err
	}
	if rev != nil {
		g.Go("CRL watcher", rev.Run)
	}

	// Pool nil: every pod gets its own HBONE pool dialling from inside its
	// network namespace (proxy.Deps).
	metrics := proxy.NewMetrics(reg)
	goRuntimeTasks(g, cfg, daemon.Load{Open: metrics.Open, Started: metrics.Started}, log)
	g.Go("metrics of deleted workloads", func(ctx context.Context) error {
		metrics.DropDeletedWorkloads(ctx, store, cfg.MetricsGrace, log.Named("metrics"))
		return nil
	})
	tracer, err := newTracer(cfg, log.Named("tracing")) // TRACING_ENDPOINT; nil when unset
	if err != nil {
		return err
	}
	defer closeTracer(tracer, log) // after the drain: the last connections' spans go out too
	factory := &inpod.ProxyFactory{Proxy: &proxy.Deps{
		Store: store, Certs: certs, Metrics: metrics, Log: log.Named("proxy"), Config: cfg,
		Revocation: revocationOf(rev), Tracer: tracer,
	}}
	if cfg.DNSProxy {
		fwd, err := dnsproxy.NewForwarder(dnsproxy.ForwarderConfig{Mark: cfg.PacketMark})
		if err != nil {
			return err
		}
		factory.DNS = &inpod.DNSTemplate{
			Config: dnsproxy.Config{Network: cfg.Network, Resolver: dnsproxy.Resolver{
				Domain: cfg.ClusterDomain, DisableIPv6: !cfg.IPv6Enabled, PreferredNamespace: cfg.PreferredServiceNamespace,
			}},
			Deps: dnsproxy.Deps{Store: store, Forwarder: fwd, Metrics: dnsproxy.NewMetrics(reg), Log: log.Named("dns")},
		}
	}
	mgr, err := inpod.New(inpod.Config{DrainDeadline: cfg.DrainDeadline}, inpod.Deps{Factory: factory, Log: log.Named("inpod"), Registerer: reg})
	if err != nil {
		return err
	}
	zdsClient, err := zds.NewClient(zds.ClientConfig{Path: cfg.InpodUDS, Handler: mgr, Log: log.Named("zds"),
		Retry: func(p backoff.Policy) *backoff.Retry { return retries.New("zds", p) }})
	if err != nil {
		return err
	}
	var statsTLS *tls.Config
	if cfg.StatsTLSCert != "" {
		kp, err := daemon.LoadKeyPairFile(cfg.StatsTLSCert, cfg.StatsTLSKey, log.Named("stats"))
		if err != nil {
			return fmt.Errorf("stats server (%s, %s): %w", config.EnvStatsTLSCert, config.EnvStatsTLSKey, err)
		}
		statsTLS = kp.TLSConfig()
	}
	adm, err := admin.Listen(admin.Config{
		AdminAddr: cfg.AdminAddr, StatsAddr: cfg.StatsAddr, ReadinessAddr: cfg.ReadinessAddr, StatsTLS: statsTLS,
	}, admin.Deps{
		Log: log.Named("admin"), Level: level, Gatherer: reg, Shutdown: g.Stop,
		Connections: func() any { return factory.Proxy.Metrics.Connections() }, // GET /connections (zctl connections)
		Dump: &admin.Dumper{State: store, Certs: certs.Dump, Config: cfg, Version: daemon.Version(),
			Pods: mgr.Dump, Connections: func() []configdump.Connection { return dumpConnections(factory.Proxy.Metrics.Connections()) },
			Network: cfg.Network, TrustDomain: cfg.TrustDomain,
			Sections: map[string]func() any{dumpKeyCRL: crlDump(rev), dumpKeyRetries: func() any { return retries.Status() }}},
		Readiness: g.Readiness(),
	})
	if err != nil {
		return err
	}
	g.Go("admin servers", adm.Serve)
	// The pods' listeners drain when the group reaches this task, after
	// the node agent's link and the pending pod retries have stopped.
	g.Go("pod listeners", func(ctx context.Context) error { <-ctx.Done(); return nil }, daemon.OnStop(func() {
		log.Info("shutting down: draining pod listeners", zap.Duration("deadline", cfg.DrainDeadline))
		mgr.Shutdown(context.Background()) // each pod bounded by DrainDeadline
	}))
	g.Go(admin.TaskWorkloadProxyManager, mgr.Run, daemon.ReadyWhen(daemon.Closed(mgr.Ready())))
	releaseStartupCode(g, cfg, log, xc.Synced(), mgr.Ready())
	// Pods are taken (and their listeners opened) only after the first full
	// xDS sync; until then the agent holds them back.
	g.Go("zds client", func(ctx context.Context) error {
		select {
		case <-xc.Synced():
		case <-ctx.Done():
			return nil
		}
		log.Info("state synced; connecting to the node agent", zap.String("socket", cfg.InpodUDS))
		return zdsClient.Run(ctx)
	})
	return g.Wait()
}
