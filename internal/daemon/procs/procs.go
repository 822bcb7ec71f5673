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
//
// "All of them" is runtime.SetDefaultGOMAXPROCS: the runtime's default,
// which then follows a changed CPU limit again (setting GOMAXPROCS stops
// that until the default is restored).
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
	// Max is the ceiling: 0 means the runtime's default (which follows
	// the CPU limit), re-read each time Run goes back to it.
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
// starts with one P. With a ceiling of one it returns at once. With
// Max 0 it is for a process whose environment does not set GOMAXPROCS:
// the default it goes back to ignores that variable.
func Run(ctx context.Context, cfg Config, log *zap.Logger) {
	cfg = cfg.withDefaults()
	set := func(n int) int { runtime.GOMAXPROCS(n); return n }
	if cfg.Max == 0 {
		cfg.Max = runtime.GOMAXPROCS(0) // the default, unless GOMAXPROCS was set
		set = func(n int) int {
			if n > 1 {
				runtime.SetDefaultGOMAXPROCS()
				return runtime.GOMAXPROCS(0)
			}
			runtime.GOMAXPROCS(n)
			return n
		}
	}
	if cfg.Max <= 1 {
		return
	}
	run(ctx, cfg, log, cpuTime, set)
}

// run adapts with set, which sets a P count and returns the count set
// (for the ceiling, what the default is now).
func run(ctx context.Context, cfg Config, log *zap.Logger, usage func() time.Duration, set func(int) int) {
	cur := set(1)
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
				cur = set(n)
				if n > 1 {
					cfg.Max = cur // the default may have followed a new CPU limit
				}
				log.Debug("GOMAXPROCS", zap.Int("procs", cur), zap.Float64("cores", cores))
			}
		}
	}
}
