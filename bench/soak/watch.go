package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// watcher samples both node proxies: VmRSS from /proc/<pid>/status, the
// goroutine count (go_goroutines) and open sockets (istio_tcp_sockets_open)
// from their stats port.
type watcher struct {
	m   *meshlab.Mesh
	cfg config

	mu      sync.Mutex
	samples []sample
	base    [2]map[string]stackGroup // goroutine stacks at the baseline

	stopOnce sync.Once
	stopc    chan struct{}
	done     chan struct{}
}

// sample is one reading of both proxies (node0, node1).
type sample struct {
	t          time.Time
	rssKB      [2]int64
	fileKB     [2]int64 // RssFile: the binary's pages, which grow as new code runs
	goroutines [2]int
	open       [2]int // node0 outbound, node1 inbound
	// Go heap in use, heap held but unused (idle minus released to the
	// OS) and stacks, in KiB: what of VmRSS is live and what is retained.
	heapInuse, heapRetained, stacks [2]int64
}

// counts is a summary reading: goroutines and VmRSS per node.
type counts struct {
	goroutines [2]int
	rssKB      [2]int64
	// liveKB is the Go heap in use right after two forced GCs (HeapAlloc):
	// what the proxy still references, free of the runtime's retained
	// memory that makes VmRSS swing from wave to wave.
	liveKB [2]int64
}

func (c counts) total() int { return c.goroutines[0] + c.goroutines[1] }

func newWatcher(m *meshlab.Mesh, cfg config) (*watcher, error) {
	w := &watcher{m: m, cfg: cfg, stopc: make(chan struct{}), done: make(chan struct{})}
	if _, err := w.read(); err != nil {
		return nil, err
	}
	go w.loop()
	return w, nil
}

func (w *watcher) loop() {
	defer close(w.done)
	t := time.NewTicker(w.cfg.sample)
	defer t.Stop()
	for {
		select {
		case <-w.stopc:
			return
		case <-t.C:
		}
		s, err := w.read()
		if err != nil {
			logf("sample: %v", err)
			continue
		}
		w.mu.Lock()
		w.samples = append(w.samples, s)
		w.mu.Unlock()
	}
}

func (w *watcher) stop() {
	w.stopOnce.Do(func() { close(w.stopc) })
	<-w.done
}

// read takes one sample now.
func (w *watcher) read() (sample, error) {
	s := sample{t: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, mn := range w.m.Nodes[:2] {
		st, err := benchkit.Status(mn.Proxy.PID())
		if err == nil && st["VmRSS"] == 0 {
			err = errors.New("no VmRSS in /proc status")
		}
		if err != nil {
			return s, fmt.Errorf("node%d proxy: %w", i, err)
		}
		s.rssKB[i], s.fileKB[i] = st["VmRSS"], st["RssFile"]
		mfs, err := w.m.Metrics(ctx, i)
		if err != nil {
			return s, err
		}
		for _, mt := range mfs["go_goroutines"].GetMetric() {
			s.goroutines[i] = int(mt.GetGauge().GetValue())
		}
		gauge := func(name string) int64 {
			for _, mt := range mfs[name].GetMetric() {
				return int64(mt.GetGauge().GetValue()) / 1024
			}
			return -1
		}
		s.heapInuse[i] = gauge("go_memstats_heap_inuse_bytes")
		s.heapRetained[i] = gauge("go_memstats_heap_idle_bytes") - gauge("go_memstats_heap_released_bytes")
		s.stacks[i] = gauge("go_memstats_stack_inuse_bytes")
		reporter := []string{"source", "destination"}[i]
		for _, mt := range mfs["istio_tcp_sockets_open"].GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "reporter" && l.GetValue() == reporter {
					s.open[i] = int(mt.GetGauge().GetValue())
				}
			}
		}
	}
	return s, nil
}

// istioSeries counts the istio_* series both node proxies export.
func (w *watcher) istioSeries() (int, error) {
	nodes, err := w.nodeMetrics()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, mfs := range nodes {
		n += countSeries(mfs, "istio_")
	}
	return n, nil
}

// nodeMetrics scrapes both node proxies, node0 first.
func (w *watcher) nodeMetrics() ([]map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]map[string]*dto.MetricFamily, 0, 2)
	for i := range w.m.Nodes[:2] {
		mfs, err := w.m.Metrics(ctx, i)
		if err != nil {
			return nil, err
		}
		out = append(out, mfs)
	}
	return out, nil
}

// countSeries counts the series of the families whose name has prefix.
func countSeries(mfs map[string]*dto.MetricFamily, prefix string) int {
	n := 0
	for name, mf := range mfs {
		if strings.HasPrefix(name, prefix) {
			n += len(mf.GetMetric())
		}
	}
	return n
}

// alive fails when a node proxy has exited.
func (w *watcher) alive() error {
	for i, mn := range w.m.Nodes[:2] {
		select {
		case <-mn.Proxy.Done():
			return fmt.Errorf("node%d proxy exited: %v; log %s", i, mn.Proxy.Err(), mn.Proxy.LogPath())
		default:
		}
	}
	return nil
}

// baseline waits for the mesh to be quiet (no open sockets, the pool's
// idle connections closed), then takes the median of three readings, and keeps the goroutine stacks for explain.
func (w *watcher) baseline() (counts, error) {
	if _, _, ok := w.waitDrained(drainTimeout); !ok {
		return counts{}, fmt.Errorf("the proxies still count open sockets before the first wave")
	}
	// The smoke test's pooled HBONE connections close after the pool's
	// idle timeout; the baseline is the mesh without them.
	time.Sleep(w.cfg.poolIdle + 3*time.Second)
	var rs []sample
	for range 3 {
		s, err := w.read()
		if err != nil {
			return counts{}, err
		}
		rs = append(rs, s)
		time.Sleep(time.Second)
	}
	var c counts
	var err error
	for i := range 2 {
		g := []int{rs[0].goroutines[i], rs[1].goroutines[i], rs[2].goroutines[i]}
		r := []int64{rs[0].rssKB[i], rs[1].rssKB[i], rs[2].rssKB[i]}
		sort.Ints(g)
		sort.Slice(r, func(a, b int) bool { return r[a] < r[b] })
		c.goroutines[i], c.rssKB[i] = g[1], r[1]
	}
	for i := range 2 {
		w.base[i] = w.stacks(i)
		var one int64
		if one, c.liveKB[i], err = w.liveHeap(i); err != nil {
			return counts{}, err
		}
		logf("node%d proxy: baseline live heap %d KiB after one GC, %d KiB after two", i, one, c.liveKB[i])
	}
	if w.cfg.profile != "" {
		w.profiles("baseline")
	}
	return c, nil
}

// waitDrained polls until both proxies count no open sockets or timeout
// passes; it returns the last counts and whether they reached zero.
func (w *watcher) waitDrained(timeout time.Duration) (left0, left1 int, ok bool) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := w.read()
		if err == nil && s.open[0] == 0 && s.open[1] == 0 {
			return 0, 0, true
		}
		if err == nil {
			left0, left1 = s.open[0], s.open[1]
		}
		if time.Now().After(deadline) {
			return left0, left1, false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// mark logs the proxies at the end of wave n.
func (w *watcher) mark(n int) {
	s, err := w.read()
	if err != nil {
		logf("after wave %d: %v", n, err)
		return
	}
	logf("after wave %d: goroutines %d / %d, VmRSS %d / %d KiB, Go heap in use %d / %d KiB, idle not released %d / %d KiB, stacks %d / %d KiB (node0 / node1)", n,
		s.goroutines[0], s.goroutines[1], s.rssKB[0], s.rssKB[1], s.heapInuse[0], s.heapInuse[1],
		s.heapRetained[0], s.heapRetained[1], s.stacks[0], s.stacks[1])
}

// settle waits up to timeout for each proxy's goroutines to come back to
// its baseline, then returns a final reading.
func (w *watcher) settle(base counts, timeout time.Duration) (counts, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	var s sample
	var err error
	for {
		s, err = w.read()
		if err == nil && s.goroutines[0] <= base.goroutines[0] && s.goroutines[1] <= base.goroutines[1] {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		return counts{}, err
	}
	logf("end: goroutines %d / %d (baseline %d / %d), VmRSS %d / %d KiB (baseline %d / %d), after %v of settling",
		s.goroutines[0], s.goroutines[1], base.goroutines[0], base.goroutines[1],
		s.rssKB[0], s.rssKB[1], base.rssKB[0], base.rssKB[1], time.Since(start).Round(time.Second))
	end := counts{goroutines: s.goroutines, rssKB: s.rssKB}
	for i := range 2 {
		var one int64
		if one, end.liveKB[i], err = w.liveHeap(i); err != nil {
			return counts{}, err
		}
		logf("node%d proxy: live heap %d KiB at the baseline; at the end %d KiB after one GC, %d KiB after two",
			i, base.liveKB[i], one, end.liveKB[i])
	}
	if w.cfg.profile != "" {
		w.profiles("end")
	}
	return end, nil
}

// rssSlope is the least-squares slope of each proxy's VmRSS samples after
// the first wave, in KiB per minute; it returns the larger. With two or
// more waves the fit ends at the last wave's end, so both ends of the
// window sit at the same point of the wave cycle (a sawtooth cut mid-wave
// would tilt the fit); with one wave it runs to the last sample.
func (w *watcher) rssSlope(waveEnds []time.Time) float64 {
	w.mu.Lock()
	samples := append([]sample(nil), w.samples...)
	w.mu.Unlock()
	from, to := waveEnds[0], time.Now()
	if len(waveEnds) >= 2 {
		to = waveEnds[len(waveEnds)-1]
	}
	var window []sample
	for _, s := range samples {
		if !s.t.Before(from) && !s.t.After(to) {
			window = append(window, s)
		}
	}
	return largerSlope(window, from, vmRSS, fmt.Sprintf("after the first wave (%.1f min)", to.Sub(from).Minutes()))
}

// restSlope is the least-squares slope of each proxy's VmRSS read at
// rest (rests: one sample per gap, each right before a wave opens), in
// KiB per minute; it returns the larger. What a leak leaves behind is
// held at rest; the fit through every sample also follows how long each
// cycle stayed at its peak, which the open rate on a shared machine
// decides (bench/README, Soak): cycles a few MiB apart tilt it by
// thousands of KiB per minute.
func restSlope(rests []sample) float64 {
	if len(rests) == 0 {
		return 0
	}
	return largerSlope(rests, rests[0].t, vmRSS, "at rest")
}

// restAnonSlope is restSlope of VmRSS less RssFile: the memory the process
// itself holds, without the executable's pages. Those come back from the
// page cache as code first runs after the start-up release and level off
// after some minutes (bench/README, Soak, "the slope at rest"); a leak
// shows here as well as in the total, the binary's pages only there.
func restAnonSlope(rests []sample) float64 {
	if len(rests) == 0 {
		return 0
	}
	return largerSlope(rests, rests[0].t, notFile, "at rest without file-backed pages")
}

func vmRSS(s sample, i int) int64   { return s.rssKB[i] }
func notFile(s sample, i int) int64 { return s.rssKB[i] - s.fileKB[i] }

// largerSlope fits each proxy's value of samples (KiB) against the
// minutes since from, logs each fit as what, and returns the larger slope
// in KiB/min (0 when neither has enough samples).
func largerSlope(samples []sample, from time.Time, value func(sample, int) int64, what string) float64 {
	var maxSlope float64
	for i := range 2 {
		var xs, ys []float64
		for _, s := range samples {
			xs = append(xs, s.t.Sub(from).Minutes())
			ys = append(ys, float64(value(s, i)))
		}
		slope, ok := leastSquares(xs, ys)
		if !ok {
			logf("node%d: %d RSS samples %s, too few for a slope", i, len(xs), what)
			continue
		}
		logf("node%d proxy: VmRSS slope %s %.1f KiB/min over %d samples", i, what, slope, len(xs))
		if i == 0 || slope > maxSlope {
			maxSlope = slope
		}
	}
	return maxSlope
}

// leastSquares returns the slope of the least-squares line through (xs, ys).
func leastSquares(xs, ys []float64) (float64, bool) {
	n := float64(len(xs))
	if len(xs) < 3 {
		return 0, false
	}
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx == 0 {
		return 0, false
	}
	return sxy / sxx, true
}

// admin GETs path from node i's proxy admin endpoint.
func (w *watcher) admin(i int, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, body, err := w.m.NodeHTTP(ctx, i, "http://"+meshlab.ProxyAdminAddr+path)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET %s on node%d: status %d", path, i, code)
	}
	return body, err
}

// liveHeap forces two GCs in node i's proxy (its heap profile with gc=1,
// twice: a sync.Pool's items survive the first, in its victim cache) and
// returns HeapAlloc after the first and after the second, in KiB.
func (w *watcher) liveHeap(i int) (afterOne, afterTwo int64, err error) {
	for round := range 2 {
		body, err := w.admin(i, "/debug/pprof/heap?gc=1&debug=1")
		if err != nil {
			return 0, 0, fmt.Errorf("node%d proxy heap: %w", i, err)
		}
		n := int64(-1)
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, "# HeapAlloc = "); ok {
				if n, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil {
					return 0, 0, fmt.Errorf("node%d proxy heap: %q: %w", i, line, err)
				}
			}
		}
		if n < 0 {
			return 0, 0, fmt.Errorf("node%d proxy heap: no HeapAlloc line", i)
		}
		if round == 0 {
			afterOne = n / 1024
		} else {
			afterTwo = n / 1024
		}
	}
	return afterOne, afterTwo, nil
}

// setLogLevel POSTs /logging?level= to the proxy admin endpoint of node n.
func setLogLevel(ctx context.Context, n *testcluster.Node, level string) error {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.Dial(ctx, "tcp", addr)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+meshlab.ProxyAdminAddr+"/logging?level="+url.QueryEscape(level), nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("setting the log level: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("setting the log level to %s: status %d: %s", level, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

// profiles writes both proxies' goroutine (debug=1) and heap profiles as
// <tag>-node<i>.goroutines.txt and <tag>-node<i>.heap.pprof.
func (w *watcher) profiles(tag string) {
	if err := os.MkdirAll(w.cfg.profile, 0o755); err != nil {
		logf("profiles: %v", err)
		return
	}
	for i := range 2 {
		for path, name := range map[string]string{
			"/debug/pprof/goroutine?debug=1": fmt.Sprintf("%s-node%d.goroutines.txt", tag, i),
			"/debug/pprof/heap":              fmt.Sprintf("%s-node%d.heap.pprof", tag, i),
		} {
			body, err := w.admin(i, path)
			if err == nil {
				err = os.WriteFile(filepath.Join(w.cfg.profile, name), body, 0o644)
			}
			if err != nil {
				logf("profile %s: %v", name, err)
			}
		}
	}
}
