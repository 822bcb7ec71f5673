package main

import (
	"sort"
	"strconv"
	"strings"
)

// stackGroup is one group of a goroutine profile (debug=1): how many
// goroutines share a stack, and the stack's function names.
type stackGroup struct {
	count  int
	frames []string
}

// stacks fetches node i's goroutine profile and groups it by the sequence
// of function names (nil when it cannot be read).
func (w *watcher) stacks(i int) map[string]stackGroup {
	body, err := w.admin(i, "/debug/pprof/goroutine?debug=1")
	if err != nil {
		logf("goroutine profile node%d: %v", i, err)
		return nil
	}
	return parseGoroutines(string(body))
}

// parseGoroutines parses a debug=1 goroutine profile:
//
//	goroutine profile: total 23
//	5 @ 0x43e8ce 0x40a2c5 ...
//	#	0x46bd44	internal/poll.runtime_pollWait+0x84	/usr/lib/go/src/runtime/netpoll.go:343
//	...
//
// (groups separated by blank lines). Groups with the same function names
// (different PCs in one function) are merged.
func parseGoroutines(text string) map[string]stackGroup {
	out := map[string]stackGroup{}
	var cur *stackGroup
	flush := func() {
		if cur == nil {
			return
		}
		k := strings.Join(cur.frames, "\n")
		g := out[k]
		g.count += cur.count
		g.frames = cur.frames
		out[k] = g
		cur = nil
	}
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "#"):
			if cur == nil {
				continue
			}
			f := strings.Fields(line)
			if len(f) >= 3 {
				fn := f[2]
				if j := strings.LastIndex(fn, "+0x"); j > 0 {
					fn = fn[:j]
				}
				cur.frames = append(cur.frames, fn)
			}
		case strings.Contains(line, " @ "):
			flush()
			n, err := strconv.Atoi(strings.TrimSpace(line[:strings.Index(line, " @ ")]))
			if err == nil {
				cur = &stackGroup{count: n}
			}
		case strings.TrimSpace(line) == "":
			flush()
		}
	}
	flush()
	return out
}

// growth is one stack that has more goroutines now than at the baseline.
type growth struct {
	delta, now int
	frames     []string
}

// diffStacks returns the stacks of now that grew since base, most grown first.
func diffStacks(base, now map[string]stackGroup) []growth {
	var out []growth
	for k, g := range now {
		if d := g.count - base[k].count; d > 0 {
			out = append(out, growth{delta: d, now: g.count, frames: g.frames})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].delta > out[b].delta })
	return out
}

// explain prints the goroutine stacks that grew on each proxy since the
// baseline: what holds the goroutines that did not come back.
func (w *watcher) explain() {
	for i := range 2 {
		if w.base[i] == nil {
			continue
		}
		now := w.stacks(i)
		if now == nil {
			continue
		}
		grown := diffStacks(w.base[i], now)
		total := 0
		for _, g := range grown {
			total += g.delta
		}
		logf("node%d proxy: %d goroutines more than at the baseline, in %d stacks:", i, total, len(grown))
		for j, g := range grown {
			if j == 10 {
				logf("  … %d more stacks", len(grown)-j)
				break
			}
			frames := g.frames
			if len(frames) > 8 {
				frames = frames[:8]
			}
			logf("  +%d (now %d): %s", g.delta, g.now, strings.Join(frames, " ← "))
		}
	}
}
