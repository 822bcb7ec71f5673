package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
)

// waveResult is what one wave reached.
type waveResult struct {
	// peak is the number of tunnels open at once at the wave's peak: held
	// by this process and counted open by both node proxies.
	peak int
}

// Timeouts of one connection's steps.
const (
	dialTimeout  = 20 * time.Second
	echoTimeout  = 30 * time.Second
	drainTimeout = 60 * time.Second
)

// wave opens s.cfg.tunnels connections (cfg.dialers at a time, spread over
// the client pods), echoes once on each as it opens, holds them all for
// cfg.hold while echoing once more on each, then closes them all and waits
// until both proxies count no open sockets. A connection that fails is
// counted in s.errors once and closed.
func (s *soak) wave(n int) (waveResult, error) {
	cfg := s.cfg
	conns := make([]net.Conn, cfg.tunnels)
	t0 := time.Now()
	parallel(cfg.dialers, cfg.tunnels, func(i int) {
		pod := s.clients[i%len(s.clients)]
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		c, err := pod.Dial(ctx, "tcp", s.dst.String())
		cancel()
		if err != nil {
			s.errors.add("dial", n, i, err)
			return
		}
		if err := echo(c, n, i, 0, cfg.bytes); err != nil {
			s.errors.add("echo on open", n, i, err)
			c.Close()
			return
		}
		conns[i] = c
	})
	opened := 0
	for _, c := range conns {
		if c != nil {
			opened++
		}
	}
	openTime := time.Since(t0)

	// The peak, as the proxies count it: node0's outbound and node1's
	// inbound sockets (a tunnel is one of each).
	holdStart := time.Now()
	ps, err := s.watch.read()
	if err != nil {
		return waveResult{}, err
	}
	out, in := ps.open[0], ps.open[1]
	peak := min(opened, out, in)
	if s.cfg.profile != "" {
		s.watch.profiles("peak")
	}

	var failed atomic.Int64
	parallel(cfg.dialers, cfg.tunnels, func(i int) {
		c := conns[i]
		if c == nil {
			return
		}
		if err := echo(c, n, i, 1, cfg.bytes); err != nil {
			s.errors.add("echo while held", n, i, err)
			failed.Add(1)
			c.Close()
			conns[i] = nil
		}
	})
	time.Sleep(time.Until(holdStart.Add(cfg.hold)))

	t1 := time.Now()
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	left0, left1, drained := s.watch.waitDrained(drainTimeout)
	drainTime := time.Since(t1)
	logf("wave %d: %d/%d opened in %v (%.0f/s), peak %d (proxies: %d out, %d in; VmRSS %d / %d KiB, Go heap in use %d / %d KiB, goroutines %d / %d), %d failed while held, closed; drained in %v; errors so far %d",
		n, opened, cfg.tunnels, openTime.Round(time.Millisecond), float64(opened)/openTime.Seconds(), peak, out, in,
		ps.rssKB[0], ps.rssKB[1], ps.heapInuse[0], ps.heapInuse[1], ps.goroutines[0], ps.goroutines[1],
		failed.Load(), drainTime.Round(time.Millisecond), s.errors.total())
	if !drained {
		// Tunnels the clients closed that a proxy still counts open: a leak
		// of connections (and their goroutines) in that proxy.
		logf("wave %d: after %v the proxies still count %d (node0 outbound) and %d (node1 inbound) open sockets",
			n, drainTimeout, left0, left1)
	}
	return waveResult{peak: peak}, nil
}

// echo writes size bytes of the pattern of (wave, id, round) on c and
// checks that the same bytes come back.
func echo(c net.Conn, wave, id, round, size int) error {
	want := pattern(wave, id, round, size)
	if err := c.SetDeadline(time.Now().Add(echoTimeout)); err != nil {
		return err
	}
	if _, err := c.Write(want); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, size)
	if n, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read (%d of %d bytes): %w", n, size, err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		return fmt.Errorf("wrong bytes: the echo differs from byte %d on", i)
	}
	return nil
}

// pattern is size bytes unique to (wave, id, round): a header naming them,
// then pseudo-random bytes seeded by them.
func pattern(wave, id, round, size int) []byte {
	b := make([]byte, max(size, 12))
	binary.BigEndian.PutUint32(b[0:], uint32(wave))
	binary.BigEndian.PutUint32(b[4:], uint32(id))
	binary.BigEndian.PutUint32(b[8:], uint32(round))
	r := rand.New(rand.NewPCG(uint64(wave)<<32|uint64(id), uint64(round)))
	for i := 12; i < len(b); i += 8 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], r.Uint64())
		copy(b[i:], w[:])
	}
	return b[:size]
}

// parallel runs fn(0..n-1) on workers goroutines.
func parallel(workers, n int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// errorLog counts failed connections by the step that failed and keeps the
// first few messages of each.
type errorLog struct {
	mu     sync.Mutex
	counts map[string]int
	first  map[string][]string
	n      int
}

const keepErrors = 5

func (e *errorLog) add(step string, wave, id int, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.counts == nil {
		e.counts, e.first = map[string]int{}, map[string][]string{}
	}
	e.counts[step]++
	e.n++
	if len(e.first[step]) < keepErrors {
		e.first[step] = append(e.first[step], fmt.Sprintf("wave %d conn %d: %v", wave, id, err))
	}
}

func (e *errorLog) total() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

// report writes the counts and first messages to stderr.
func (e *errorLog) report() {
	e.mu.Lock()
	defer e.mu.Unlock()
	steps := make([]string, 0, len(e.counts))
	for s := range e.counts {
		steps = append(steps, s)
	}
	sort.Strings(steps)
	for _, s := range steps {
		logf("errors (%s): %d", s, e.counts[s])
		for _, m := range e.first[s] {
			logf("  %s", m)
		}
	}
}

// verifyPath checks that the waves' connections went through both node
// proxies over mTLS (HBONE): node0 counts them as outbound (reporter
// source), node1 as inbound (reporter destination). Figures from a run
// where this fails would not be the mesh's.
func (s *soak) verifyPath(waves int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	want := float64(waves*s.cfg.tunnels - s.errors.total())
	for node, reporter := range []string{"source", "destination"} {
		mfs, err := s.m.Metrics(ctx, node)
		if err != nil {
			return fmt.Errorf("verifying the path: %w", err)
		}
		got := meshlab.Counter(mfs, "istio_tcp_connections_opened_total",
			map[string]string{"reporter": reporter, "connection_security_policy": "mutual_tls", "destination_workload_namespace": "soak"})
		logf("node%d proxy: %.0f mTLS connections opened (reporter %s)", node, got, reporter)
		if got < want {
			return fmt.Errorf("node%d proxy counted %.0f mTLS connections (reporter %s), want at least %.0f: the tunnels did not all go through the mesh",
				node, got, reporter, want)
		}
	}
	return nil
}
