package main

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/procs"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
)

// goRuntimeTasks starts the tasks that fit the Go runtime to a node
// proxy's load: memory given back after bursts and the P count.
// load is the proxy's connections, open and started: the end of a burst
// or of a run of them releases memory at once (daemon.ReleaseMemory).
func goRuntimeTasks(g *daemon.Group, cfg *config.Config, load daemon.Load, log *zap.Logger) {
	// Freed heap goes back to the system after a burst of connections.
	// 1 MiB: with 1,005 workloads the live heap is ~3 MiB, so a 4 MiB
	// threshold let the resident heap sit at twice the live one.
	g.Go("memory release", func(ctx context.Context) error {
		daemon.ReleaseMemory(ctx, 5*time.Second, 1<<20, load)
		return nil
	})
	// At a node's usual load (well under a core) each connection's
	// hand-offs between goroutines made the runtime wake a second thread
	// to look for work; one P avoids that, and a busier proxy gets every
	// P back within 100 ms (internal/daemon/procs). The node proxy keeps
	// one P until it nearly fills a core (procsUp), not 0.6 as the
	// waypoint: a bulk stream uses 0.6-0.8 of a core on each side, and
	// with two Ps its read loop and the goroutine writing to the pod woke
	// each other through a second thread (bench/mesh, one stream: 2.3-2.8
	// Gbit/s with two Ps, 3.0-3.5 with one).
	if cfg.AdaptiveProcs {
		g.Go("procs", func(ctx context.Context) error {
			procs.Run(ctx, procs.Config{Up: procsUp}, log.Named("procs"))
			return nil
		}, daemon.Once())
	}
}

// procsUp is the load, in cores, above which the node proxy takes every P.
const procsUp = 0.85

// releaseStartupCode starts the task that gives the executable's pages
// back once start-up is over (RELEASE_STARTUP_CODE): 5 s after every one
// of ready is closed, so that the first pods' listeners and certificates
// are part of start-up.
func releaseStartupCode(g *daemon.Group, cfg *config.Config, log *zap.Logger, ready ...<-chan struct{}) {
	if !cfg.ReleaseStartupCode {
		return
	}
	g.Go("startup code release", func(ctx context.Context) error {
		for _, c := range ready {
			select {
			case <-c:
			case <-ctx.Done():
				return nil
			}
		}
		select {
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
			return nil
		}
		start := time.Now()
		r, err := daemon.ReleaseStartupCode()
		if err != nil {
			// Nothing depends on it: the pages stay resident, as before.
			log.Warn("startup code not released", zap.Error(err))
			return nil
		}
		log.Info("startup code released",
			zap.Uint64("resident_kib", r.ResidentBefore>>10), zap.Uint64("resident_after_kib", r.ResidentAfter>>10),
			zap.Uint64("cached_kib", r.CachedBefore>>10), zap.Uint64("cached_after_kib", r.CachedAfter>>10),
			zap.Duration("took", time.Since(start)))
		return nil
	}, daemon.Once())
}
