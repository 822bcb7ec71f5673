package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// path is one way from a client to a server; see the package comment.
type path int

const (
	pathDirect path = iota // no proxy
	pathMesh               // our node proxies (HBONE, or passthrough)
	pathPeer               // HAProxy on both nodes (peer.go)
	numPaths
)

func (p path) String() string { return [...]string{"direct", "mesh", "peer"}[p] }

// rotate returns ps rotated left by r: round r of an alternated
// measurement runs the paths in this order.
func rotate[T any](ps []T, r int) []T {
	if len(ps) == 0 {
		return nil
	}
	r %= len(ps)
	return append(slices.Clone(ps[r:]), ps[:r]...)
}

// target is where one path's client connects.
type target struct {
	client *testcluster.Pod
	dst    string // address without port
}

// pair holds one figure per round and path.
type pair struct {
	unit string
	v    [numPaths][]float64
}

func best(v []float64) float64 { return slices.Max(v) }

// ratio is path p's best round ÷ the direct path's best round (the box is
// shared: the best round is the one least disturbed by other jobs).
func (pr pair) ratio(p path) float64 { return best(pr.v[p]) / best(pr.v[pathDirect]) }

// iperfPair runs iperf3 with streams parallel streams on each path that has
// a target, alternating the paths' order for b.rounds rounds, and returns
// the received Gbit/s per round. With profile set (and -profile), the first
// mesh round is CPU-profiled on both proxies.
func (b *bench) iperfPair(ctx context.Context, label string, streams int, targets map[path]target, profile string) (pair, error) {
	res := pair{unit: "Gbit/s"}
	var order []path
	for p := range numPaths {
		if _, ok := targets[p]; ok {
			order = append(order, p)
		}
	}
	for r := 0; r < b.rounds; r++ {
		for _, p := range rotate(order, r) {
			t := targets[p]
			var stopProf func()
			if p == pathMesh && r == 0 && profile != "" && b.profileDir != "" {
				stopProf = b.profileProxies(profile, b.iperfSecs+1)
			}
			gbps, err := b.iperf(ctx, t.client, t.dst, streams)
			if stopProf != nil {
				stopProf()
			}
			if err != nil {
				return res, fmt.Errorf("iperf3 %s %s %s→%s: %w", label, p, t.client.Namespace, t.dst, err)
			}
			res.v[p] = append(res.v[p], gbps)
		}
	}
	msg := fmt.Sprintf("iperf3 %-13s mesh %s Gbit/s, direct %s Gbit/s", label, fmtList(res.v[pathMesh]), fmtList(res.v[pathDirect]))
	if len(res.v[pathPeer]) > 0 {
		msg += fmt.Sprintf(", peer %s Gbit/s", fmtList(res.v[pathPeer]))
	}
	msg += fmt.Sprintf(" (per round; best counts) → mesh %.3f", res.ratio(pathMesh))
	if len(res.v[pathPeer]) > 0 {
		msg += fmt.Sprintf(", peer %.3f", res.ratio(pathPeer))
	}
	logf("%s", msg)
	return res, nil
}

// iperf runs one iperf3 client in pod c against dst and returns the
// receiver's Gbit/s (summed over streams), the first second omitted.
func (b *bench) iperf(ctx context.Context, c *testcluster.Pod, dst string, streams int) (float64, error) {
	args := []string{"iperf3", "-c", dst, "-p", strconv.Itoa(iperfPort), "-t", strconv.Itoa(b.iperfSecs), "-O", "1", "-P", strconv.Itoa(streams), "-J"}
	var out []byte
	var err error
	for try := 0; try < 3; try++ {
		cctx, cancel := context.WithTimeout(ctx, time.Duration(b.iperfSecs+15)*time.Second)
		out, err = c.Exec(cctx, args...)
		cancel()
		// The server takes a moment after a test before it accepts the next.
		if err == nil || !strings.Contains(string(out), "busy") {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if err != nil {
		return 0, err
	}
	var res struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return 0, fmt.Errorf("parsing iperf3 JSON: %w", err)
	}
	if res.Error != "" {
		return 0, fmt.Errorf("iperf3: %s", res.Error)
	}
	if res.End.SumReceived.BitsPerSecond <= 0 {
		return 0, fmt.Errorf("iperf3 reported no bytes received")
	}
	return res.End.SumReceived.BitsPerSecond / 1e9, nil
}

// pathLoad is one path's fortio runs (one per round) and its two proxies'
// CPU while they ran (not sampled for the direct path).
type pathLoad struct {
	runs     []fortioResult
	cpuSecs  [2]float64       // per node
	runqWait [2]time.Duration // per node: runnable but not running
	wall     float64          // seconds, summed over the rounds
}

func (pl pathLoad) qps() float64 {
	var sum float64
	for _, r := range pl.runs {
		sum += r.ActualQPS
	}
	return sum / float64(len(pl.runs))
}

func (pl pathLoad) requests() int64 {
	var n int64
	for _, r := range pl.runs {
		n += r.DurationHistogram.Count
	}
	return n
}

// latencyResult holds every path's load.
type latencyResult struct{ p [numPaths]pathLoad }

// added is path p's percentile minus the direct path's of the same round,
// in µs, averaged over the rounds.
func (l latencyResult) added(p path, pct float64) float64 {
	runs := l.p[p].runs
	var sum float64
	for i, r := range runs {
		sum += r.percentile(pct) - l.p[pathDirect].runs[i].percentile(pct)
	}
	return sum / float64(len(runs)) * 1e6
}

// cpuPer1kPerProxy is path p's proxies' mean CPU per proxy (vCPU, i.e.
// CPU-seconds per second, of the two proxies ÷ 2) per 1000 requests/s.
func (l latencyResult) cpuPer1kPerProxy(p path) float64 {
	pl := l.p[p]
	vcpu := (pl.cpuSecs[0] + pl.cpuSecs[1]) / pl.wall / 2
	return vcpu / (pl.qps() / 1000)
}

type fortioResult struct {
	ActualQPS         float64
	RetCodes          map[string]int64
	DurationHistogram struct {
		Count       int64
		Avg         float64
		Percentiles []struct {
			Percentile float64
			Value      float64
		}
	}
}

func (f fortioResult) percentile(p float64) float64 {
	for _, pc := range f.DurationHistogram.Percentiles {
		if pc.Percentile == p {
			return pc.Value
		}
	}
	return 0
}

const (
	fortioQPS   = 1000
	fortioConns = 4
	fortioTime  = 10 * time.Second
	payloadSize = 1024
)

// latency runs fortio (HTTP/1.1, 1 KiB POST bodies echoed back, 1000
// requests/s over 4 connections) on every path, b.latencyRounds rounds with
// the order rotated each round, sampling the proxies' CPU time on the mesh
// and the peer path.
func (b *bench) latency(ctx context.Context) (latencyResult, error) {
	var l latencyResult
	targets := map[path]target{
		pathDirect: {b.directClient, b.directServer.IP.String()},
		pathMesh:   {b.meshClient, b.meshServer.IP.String()},
	}
	order := []path{pathDirect, pathMesh}
	if b.peer != nil {
		targets[pathPeer] = target{b.directClient, b.peer.addr.String()}
		order = append(order, pathPeer)
	}
	for r := 0; r < b.latencyRounds; r++ {
		for _, p := range rotate(order, r) {
			if err := b.latencyRun(ctx, &l.p[p], p, r, targets[p]); err != nil {
				return l, err
			}
			f := l.p[p].runs[r]
			logf("fortio round %d %-6s %.0f req/s, p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, avg %.0f µs (%d requests)", r, p, f.ActualQPS,
				f.percentile(50)*1e6, f.percentile(90)*1e6, f.percentile(99)*1e6, f.DurationHistogram.Avg*1e6, f.DurationHistogram.Count)
		}
	}
	for _, p := range order[1:] {
		pl := l.p[p]
		logf("%s proxies' CPU during the %s runs (%.1f s): node0 %.2f s (%.3f vCPU), node1 %.2f s (%.3f vCPU)",
			p, p, pl.wall, pl.cpuSecs[0], pl.cpuSecs[0]/pl.wall, pl.cpuSecs[1], pl.cpuSecs[1]/pl.wall)
		n := float64(pl.requests())
		logf("%s proxies' threads runnable but waiting for a CPU: node0 %.0f µs, node1 %.0f µs per request",
			p, float64(pl.runqWait[0].Microseconds())/n, float64(pl.runqWait[1].Microseconds())/n)
	}
	return l, nil
}

// latencyRun is one fortio run on path p (round r) into pl, with the CPU of
// p's proxies around it.
func (b *bench) latencyRun(ctx context.Context, pl *pathLoad, p path, r int, t target) error {
	var pids [2]int
	switch p {
	case pathMesh:
		pids = b.proxyPIDs()
	case pathPeer:
		pids = b.peerPIDs()
	}
	var before, after [2]float64
	var waitBefore [2]time.Duration
	var err error
	if p != pathDirect {
		if before, err = procCPU(pids); err != nil {
			return err
		}
		waitBefore = runqWait(pids)
	}
	var stopProf func()
	if p == pathMesh && r == 0 && b.profileDir != "" {
		stopProf = b.profileProxies("fortio", int(fortioTime/time.Second)-1)
	}
	t0 := time.Now()
	f, err := b.fortioLoad(ctx, t.client, t.dst)
	wall := time.Since(t0).Seconds()
	if stopProf != nil {
		stopProf()
	}
	if err != nil {
		return fmt.Errorf("fortio %s: %w", p, err)
	}
	pl.runs = append(pl.runs, f)
	if p == pathDirect {
		return nil
	}
	if after, err = procCPU(pids); err != nil {
		return err
	}
	waitAfter := runqWait(pids)
	pl.wall += wall
	for i := range pl.cpuSecs {
		pl.cpuSecs[i] += after[i] - before[i]
		pl.runqWait[i] += waitAfter[i] - waitBefore[i]
	}
	return nil
}

func (b *bench) fortioLoad(ctx context.Context, client *testcluster.Pod, server string) (fortioResult, error) {
	out := filepath.Join(b.prog.TempDir(), "fortio.json")
	url := fmt.Sprintf("http://%s:%d/echo", server, fortioPort)
	cctx, cancel := context.WithTimeout(ctx, fortioTime+20*time.Second)
	defer cancel()
	if _, err := client.Exec(cctx, b.fortio, "load", "-quiet",
		"-qps", strconv.Itoa(fortioQPS), "-c", strconv.Itoa(fortioConns), "-t", fortioTime.String(),
		"-payload-size", strconv.Itoa(payloadSize), "-r", "0.00001", "-p", "50,90,99",
		"-json", out, url); err != nil {
		return fortioResult{}, err
	}
	data, err := os.ReadFile(out)
	if err != nil {
		return fortioResult{}, err
	}
	var f fortioResult
	if err := json.Unmarshal(data, &f); err != nil {
		return f, fmt.Errorf("parsing fortio JSON: %w", err)
	}
	ok := f.RetCodes["200"]
	if ok == 0 || ok != f.DurationHistogram.Count {
		return f, fmt.Errorf("fortio %s→%s: return codes %v of %d requests", client.Namespace, url, f.RetCodes, f.DurationHistogram.Count)
	}
	return f, nil
}

func fmtList(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strings.Join(s, " / ")
}
