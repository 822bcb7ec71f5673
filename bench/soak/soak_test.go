package main

import (
	"bytes"
	"math"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

func TestLeastSquares(t *testing.T) {
	xs := []float64{0, 1, 2, 3, 4}
	ys := []float64{10, 12, 14, 16, 18}
	if s, ok := leastSquares(xs, ys); !ok || math.Abs(s-2) > 1e-9 {
		t.Errorf("slope = %v, %v; want 2", s, ok)
	}
	// A sawtooth cut at the same phase at both ends has no slope.
	xs, ys = nil, nil
	for i := range 41 {
		xs = append(xs, float64(i))
		ys = append(ys, float64(i%10))
	}
	if s, ok := leastSquares(xs[:41], ys[:41]); !ok || math.Abs(s) > 0.2 {
		t.Errorf("sawtooth slope = %v, %v; want about 0", s, ok)
	}
	if _, ok := leastSquares([]float64{1, 2}, []float64{1, 2}); ok {
		t.Error("two points gave a slope")
	}
	if _, ok := leastSquares([]float64{1, 1, 1}, []float64{1, 2, 3}); ok {
		t.Error("no spread in x gave a slope")
	}
}

const profileText = `goroutine profile: total 7
4 @ 0x43e8ce 0x40a2c5 0x40a2c6
#	0x46bd44	internal/poll.runtime_pollWait+0x84	/go/src/runtime/netpoll.go:343
#	0x4a1c2e	github.com/ztunnel-go/ztunnel-go/hbone.(*conn).readLoop+0x2e	/x/hbone/conn_read.go:40

2 @ 0x43e8ce 0x40a2c5 0x40a2c7
#	0x46bd44	internal/poll.runtime_pollWait+0x90	/go/src/runtime/netpoll.go:345
#	0x4a1c2e	github.com/ztunnel-go/ztunnel-go/hbone.(*conn).readLoop+0x40	/x/hbone/conn_read.go:44

1 @ 0x43e8ce
#	0x43e8cd	runtime.gopark+0xcd	/go/src/runtime/proc.go:402
`

func TestParseGoroutines(t *testing.T) {
	g := parseGoroutines(profileText)
	if len(g) != 2 {
		t.Fatalf("got %d groups, want 2 (same functions merged): %v", len(g), g)
	}
	k := "internal/poll.runtime_pollWait\ngithub.com/ztunnel-go/ztunnel-go/hbone.(*conn).readLoop"
	if g[k].count != 6 {
		t.Errorf("readLoop group = %d goroutines, want 6", g[k].count)
	}
	base := map[string]stackGroup{k: {count: 2}}
	d := diffStacks(base, g)
	if len(d) != 2 || d[0].delta != 4 || d[0].now != 6 || d[1].delta != 1 {
		t.Errorf("diff = %+v, want readLoop +4 then gopark +1", d)
	}
}

func TestPattern(t *testing.T) {
	a := pattern(1, 2, 0, 1024)
	if len(a) != 1024 || !bytes.Equal(a, pattern(1, 2, 0, 1024)) {
		t.Fatal("pattern is not deterministic or has the wrong size")
	}
	for _, other := range [][]byte{pattern(1, 2, 1, 1024), pattern(1, 3, 0, 1024), pattern(2, 2, 0, 1024)} {
		if bytes.Equal(a[12:], other[12:]) {
			t.Error("two tunnels' patterns share their payload")
		}
	}
	if len(pattern(1, 1, 1, 5)) != 5 {
		t.Error("short pattern has the wrong size")
	}
}

func TestCountSeries(t *testing.T) {
	two := &dto.MetricFamily{Metric: []*dto.Metric{{}, {}}}
	mfs := map[string]*dto.MetricFamily{"istio_tcp_sent_bytes_total": two, "istio_requests_total": two, "go_goroutines": two}
	if n := countSeries(mfs, "istio_"); n != 4 {
		t.Errorf("countSeries = %d, want 4", n)
	}
}

// TestRestSlope: the fit through the at-rest samples reports the larger
// proxy's slope in KiB per minute, and nothing for fewer than three gaps;
// the fit without file-backed pages takes RssFile out of each sample.
func TestRestSlope(t *testing.T) {
	t0 := time.Now()
	var rests []sample
	for i := range 6 {
		s := sample{t: t0.Add(time.Duration(i) * 20 * time.Second)}
		s.rssKB = [2]int64{40000 + int64(i%2)*100, 42000 + int64(i)*50} // node1 grows 150 KiB/min
		rests = append(rests, s)
	}
	if got := restSlope(rests); math.Abs(got-150) > 1e-6 {
		t.Errorf("restSlope = %v, want 150 (node1's)", got)
	}
	if got := restSlope(rests[:2]); got != 0 {
		t.Errorf("restSlope of two gaps = %v, want 0 (no fit)", got)
	}
	// Without the file-backed pages: node1's growth is 120 KiB/min of the
	// binary's pages coming back and 30 of its own; node0's own memory
	// grows 60 KiB/min under file-backed pages that shrink.
	for i := range rests {
		rests[i].fileKB = [2]int64{8000 - int64(i)*20, 8000 + int64(i)*40}
		rests[i].rssKB[0] = rests[i].fileKB[0] + 32000 + int64(i)*20
	}
	if got := restAnonSlope(rests); math.Abs(got-60) > 1e-6 {
		t.Errorf("restAnonSlope = %v, want 60 (node0's)", got)
	}
	if got := restSlope(rests); math.Abs(got-150) > 1e-6 {
		t.Errorf("restSlope with file-backed pages = %v, want 150 (node1's)", got)
	}
}
