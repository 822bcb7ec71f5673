// Package procs sizes GOMAXPROCS to a proxy's load: one P while the
// process uses less than a core, all of them (the runtime's own default,
// which follows the CPU limit) above that.
//
// Why: a proxy hands every request from a connection's read loop to the
// goroutine that serves it. Waking a goroutine while a P is idle makes the
// runtime wake a second thread to look for work (runtime.wakep: a futex
// wake, a spin that steals or finds nothing, a futex sleep), so at a low
// load most of each hand-off's cost is that thread, not the work. With one
// P the woken goroutine runs on the waking thread as soon as the read loop
// parks. Measured on the waypoint (bench/waypoint, 1k req/s, 2 cores):
// 0.24 vCPU per 1k req/s with two Ps, 0.16 with one. Above a core the load
// needs the second P, and it gets it within one interval.
package procs

import (
	"context"
	"runtime"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Config tunes Run; the zero value is the default.
type Config struct {
	// Max is the ceiling: 0 means runtime.GOMAXPROCS(0) when Run starts.
	Max int
	// Interval between load readings; 0 means 100 ms.
	Interval time.Duration
	// Up: with one P, a reading above Up cores restores Max at once;
	// 0 means 0.6.
	Up float64
	// Down: with Max Ps, DownAfter readings in a row below Down cores go
	// back to one P; 0 means 0.35 and 20 (2 s at 100 ms). Down is lower
	// than Up by more than two Ps cost over one for the same load, so the
	// count does not flap.
	Down      float64
	DownAfter int
}

func (c Config) withDefaults() Config {
	if c.Max == 0 {
		c.Max = runtime.GOMAXPROCS(0)
	}
	if c.Interval == 0 {
		c.Interval = 100 * time.Millisecond
	}
	if c.Up == 0 {
		c.Up = 0.6
	}
	if c.Down == 0 {
		c.Down = 0.35
	}
	if c.DownAfter == 0 {
		c.DownAfter = 20
	}
	return c
}

// next is the decision: the P count after a reading of cores used at cur
// Ps, and how many low readings in a row there are now.
func (c Config) next(cur int, cores float64, low int) (int, int) {
	if cur < c.Max {
		if cores > c.Up {
			return c.Max, 0
		}
		return cur, 0
	}
	if cores >= c.Down {
		return cur, 0
	}
	if low+1 >= c.DownAfter {
		return 1, 0
	}
	return cur, low + 1
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Run adapts GOMAXPROCS until ctx ends, then restores the ceiling. It
// starts with one P. With a ceiling of one it returns at once.
func Run(ctx context.Context, cfg Config, log *zap.Logger) {
	cfg = cfg.withDefaults()
	if cfg.Max <= 1 {
		return
	}
	run(ctx, cfg, log, cpuTime, runtime.GOMAXPROCS)
}

func run(ctx context.Context, cfg Config, log *zap.Logger, usage func() time.Duration, set func(int) int) {
	cur := 1
	set(cur)
	defer set(cfg.Max)
	log.Info("GOMAXPROCS follows the load", zap.Int("procs", cur), zap.Int("max", cfg.Max),
		zap.Float64("up_cores", cfg.Up), zap.Float64("down_cores", cfg.Down))
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	last, lastAt := usage(), time.Now()
	low := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			u, now := usage(), time.Now()
			cores := float64(u-last) / float64(now.Sub(lastAt))
			last, lastAt = u, now
			n, l := cfg.next(cur, cores, low)
			low = l
			if n != cur {
				set(n)
				log.Debug("GOMAXPROCS", zap.Int("procs", n), zap.Float64("cores", cores))
				cur = n
			}
		}
	}
}
