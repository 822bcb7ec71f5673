package main

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
)

// The peer comparison (issue 17): our HBONE pair and the HAProxy mTLS pair
// on the same loopback chain, app client → proxy A → mTLS → proxy B → app
// server, with all four proxies as child processes and the apps (this
// process's sink and echo servers) and clients shared with the direct
// baseline. Each round measures direct, then both chains in alternating
// order (ours first in even rounds, HAProxy first in odd ones), with the
// same code as the in-process hbone_* figures: blast/rate for throughput,
// pingPong for the round trip, and a paced 1 KiB request/response loop.

// peerOptions are the comparison's flags.
type peerOptions struct {
	rounds  int
	rrTime  time.Duration
	threads int // GOMAXPROCS of our proxies and nbthread of HAProxy's; 0 = their defaults
}

const (
	rrConns   = 4    // connections of the request/response loop (as bench/mesh's fortio)
	rrRate    = 1000 // requests per second over all of them
	rrSize    = 1024 // request and response bytes
	rttBatch  = 250  // ping-pongs per RTT batch
	rttRounds = 8    // RTT batches per path per round
	connects  = 100  // new connections (connect + first byte) per path per round
)

// path is one way from the client to the apps: direct, or through a chain.
type path struct {
	name       string
	sink, echo string
	ch         *chain // nil for direct
	best1      float64
	best8      float64
	bestRTT    time.Duration
	rr         []rrRound
	cpuPerGB   []float64       // proxies' CPU-seconds per GB, one-stream rounds
	connect    []time.Duration // median connect + first byte, per round
}

type rrRound struct {
	p50, p90, p99 time.Duration
	rate          float64 // requests per second achieved
	vcpu          float64 // both proxies' CPU-seconds per second
}

func (r rrRound) cpuPer1k() float64 { return r.vcpu / (r.rate / 1000) }

func (p *path) cpu() (time.Duration, error) {
	if p.ch == nil {
		return 0, nil
	}
	return p.ch.cpu()
}

func runPeer(e *env, o peerOptions) error {
	dir, err := tempDir()
	if err != nil {
		return err
	}
	defer reaper.RemoveDir(dir)
	ours, err := startHBONEChain(e, dir, o.threads)
	if err != nil {
		return err
	}
	defer ours.stop()
	peer, err := startHAProxyChain(e, dir, o.threads)
	if err != nil {
		return err
	}
	defer peer.stop()

	direct := &path{name: "direct", sink: e.sink.String(), echo: e.echo.String()}
	hb := &path{name: "hbone", sink: ours.sink, echo: ours.echo, ch: ours}
	ha := &path{name: "haproxy", sink: peer.sink, echo: peer.echo, ch: peer}
	for _, p := range []*path{hb, ha} {
		if err := checkEcho(p.echo); err != nil {
			return fmt.Errorf("%s chain: %w", p.name, err)
		}
	}
	logf("peer: %d rounds; proxies as child processes (hbone pids %v, haproxy pids %v), threads per proxy %s",
		o.rounds, ours.pids, peer.pids, threadsLabel(o.threads))
	for r := range o.rounds {
		order := []*path{direct, hb, ha}
		if r%2 == 1 {
			order = []*path{direct, ha, hb}
		}
		if err := peerRound(r, order, o); err != nil {
			return fmt.Errorf("peer round %d: %w", r, err)
		}
	}

	emit("hbone_chain_throughput_ratio", hb.best1/direct.best1, "ratio")
	emit("haproxy_throughput_ratio", ha.best1/direct.best1, "ratio")
	emit("hbone_chain_parallel_ratio", hb.best8/direct.best8, "ratio")
	emit("haproxy_parallel_ratio", ha.best8/direct.best8, "ratio")
	emit("hbone_chain_rtt_ratio", float64(hb.bestRTT)/float64(direct.bestRTT), "ratio")
	emit("haproxy_rtt_ratio", float64(ha.bestRTT)/float64(direct.bestRTT), "ratio")
	for _, p := range []*path{hb, ha} {
		cpu := make([]float64, len(p.rr))
		var a50, a90, a99 []float64
		for i, r := range p.rr {
			cpu[i] = r.cpuPer1k()
			d := direct.rr[i]
			a50 = append(a50, us(r.p50-d.p50))
			a90 = append(a90, us(r.p90-d.p90))
			a99 = append(a99, us(r.p99-d.p99))
		}
		var conn []float64
		for i, c := range p.connect {
			conn = append(conn, us(c-direct.connect[i]))
		}
		logf("peer %s: best throughput %.0f MB/s (1 stream), %.0f MB/s (8); best RTT %v; CPU-s per GB %s; rr vCPU per 1k req/s %s; connect + first byte added µs %s",
			p.name, p.best1/1e6, p.best8/1e6, p.bestRTT, fmtFloats(p.cpuPerGB, 2), fmtFloats(cpu, 3), fmtFloats(conn, 0))
		emit(p.name+"_cpu_s_per_gb", benchkit.Median(p.cpuPerGB), "cpu-s/GB")
		emit(p.name+"_connect_added_us", benchkit.Median(conn), "us")
		emit(p.name+"_rr_cpu_per_1k_rps", benchkit.Median(cpu), "vcpu")
		emit(p.name+"_rr_added_latency_p50_us", benchkit.Median(a50), "us")
		emit(p.name+"_rr_added_latency_p90_us", benchkit.Median(a90), "us")
		emit(p.name+"_rr_added_latency_p99_us", benchkit.Median(a99), "us")
	}
	logf("peer direct: best throughput %.0f MB/s (1 stream), %.0f MB/s (8); best RTT %v",
		direct.best1/1e6, direct.best8/1e6, direct.bestRTT)
	return nil
}

// peerRound measures every figure once per path, in order.
func peerRound(r int, order []*path, o peerOptions) error {
	const d = 300 * time.Millisecond
	for _, streams := range []int{1, 8} {
		var line []string
		for _, p := range order {
			c0, err := p.cpu()
			if err != nil {
				return err
			}
			t0 := time.Now()
			rt, err := rate(streams, d, func() (net.Conn, error) { return net.Dial("tcp", p.sink) })
			if err != nil {
				return fmt.Errorf("%s throughput: %w", p.name, err)
			}
			c1, err := p.cpu()
			if err != nil {
				return err
			}
			gb := rt * time.Since(t0).Seconds() / 1e9
			if streams == 1 {
				p.best1 = max(p.best1, rt)
				if p.ch != nil && gb > 0 {
					p.cpuPerGB = append(p.cpuPerGB, (c1-c0).Seconds()/gb)
				}
			} else {
				p.best8 = max(p.best8, rt)
			}
			line = append(line, fmt.Sprintf("%s %.0f MB/s", p.name, rt/1e6))
		}
		logf("peer round %d throughput %d stream(s): %s", r, streams, strings.Join(line, ", "))
	}

	conns := make([]net.Conn, len(order))
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	for i, p := range order {
		c, err := net.Dial("tcp", p.echo)
		if err != nil {
			return fmt.Errorf("%s rtt: %w", p.name, err)
		}
		conns[i] = c
		if _, err := pingPong(c, 100); err != nil { // warm up
			return fmt.Errorf("%s rtt: %w", p.name, err)
		}
	}
	for range rttRounds {
		for i, p := range order {
			t, err := pingPong(conns[i], rttBatch)
			if err != nil {
				return fmt.Errorf("%s rtt: %w", p.name, err)
			}
			if p.bestRTT == 0 || t < p.bestRTT {
				p.bestRTT = t
			}
		}
	}

	var line []string
	for _, p := range order {
		c, err := connectTimes(p)
		if err != nil {
			return fmt.Errorf("%s connect: %w", p.name, err)
		}
		p.connect = append(p.connect, c)
		line = append(line, fmt.Sprintf("%s %.0f µs", p.name, us(c)))
	}
	logf("peer round %d connect + first byte p50: %s", r, strings.Join(line, ", "))

	line = nil
	for _, p := range order {
		rr, err := rrLoad(p, o.rrTime)
		if err != nil {
			return fmt.Errorf("%s request/response: %w", p.name, err)
		}
		p.rr = append(p.rr, rr)
		s := fmt.Sprintf("%s %.0f req/s p50/p90/p99 %.0f/%.0f/%.0f µs", p.name, rr.rate, us(rr.p50), us(rr.p90), us(rr.p99))
		if p.ch != nil {
			s += fmt.Sprintf(" %.3f vCPU", rr.vcpu)
		}
		line = append(line, s)
	}
	logf("peer round %d request/response: %s", r, strings.Join(line, ", "))
	return nil
}

// rrLoad runs rrConns connections, each sending rrSize bytes and reading
// the echoed rrSize back on a fixed schedule (rrRate requests per second
// over all of them, staggered), for d. Latency is from the request's write
// to the last byte of its response; the proxies' CPU is sampled around the
// timed part.
func rrLoad(p *path, d time.Duration) (rrRound, error) {
	conns := make([]net.Conn, rrConns)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	req, resp := make([]byte, rrSize), make([]byte, rrSize)
	for i := range req {
		req[i] = byte(i)
	}
	for i := range conns {
		c, err := net.Dial("tcp", p.echo)
		if err != nil {
			return rrRound{}, err
		}
		conns[i] = c
		c.SetDeadline(time.Now().Add(d + 30*time.Second))
		for range 20 { // warm up: the chain's connections are set up end to end
			if err := exchange(c, req, resp); err != nil {
				return rrRound{}, err
			}
		}
	}
	cpu0, err := p.cpu()
	if err != nil {
		return rrRound{}, err
	}
	bufs := make([][2][]byte, rrConns)
	for i := range bufs {
		bufs[i] = [2][]byte{append([]byte(nil), req...), make([]byte, rrSize)}
	}
	all, wall, err := benchkit.Paced(rrConns, rrRate, d, func(i int) error {
		return exchange(conns[i], bufs[i][0], bufs[i][1])
	})
	if err != nil {
		return rrRound{}, err
	}
	cpu1, err := p.cpu()
	if err != nil {
		return rrRound{}, err
	}
	if len(all) == 0 {
		return rrRound{}, fmt.Errorf("no requests completed")
	}
	return rrRound{
		p50: benchkit.Percentile(all, 50), p90: benchkit.Percentile(all, 90), p99: benchkit.Percentile(all, 99),
		rate: float64(len(all)) / wall.Seconds(),
		vcpu: (cpu1 - cpu0).Seconds() / wall.Seconds(),
	}, nil
}

// connectTimes opens connects connections to p's echo app one after
// another, each until its first echoed byte, and returns the median time.
func connectTimes(p *path) (time.Duration, error) {
	d := make([]time.Duration, 0, connects)
	b := []byte{1}
	for range connects {
		t0 := time.Now()
		c, err := net.DialTimeout("tcp", p.echo, 5*time.Second)
		if err != nil {
			return 0, err
		}
		c.SetDeadline(t0.Add(10 * time.Second))
		err = exchange(c, b, make([]byte, 1))
		d = append(d, time.Since(t0))
		c.Close()
		if err != nil {
			return 0, err
		}
	}
	slices.Sort(d)
	return benchkit.Percentile(d, 50), nil
}

// exchange writes req and reads the echoed response into resp.
func exchange(c net.Conn, req, resp []byte) error {
	if _, err := c.Write(req); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, resp); err != nil {
		return err
	}
	for i := range resp {
		if resp[i] != req[i] {
			return fmt.Errorf("response byte %d is %d, want %d", i, resp[i], req[i])
		}
	}
	return nil
}

// checkEcho sends one request through addr's chain and checks the echo.
func checkEcho(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := []byte("bench/hbone peer check")
	return exchange(c, msg, make([]byte, len(msg)))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func fmtFloats(v []float64, prec int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.*f", prec, x)
	}
	return strings.Join(s, " / ")
}

func threadsLabel(n int) string {
	if n <= 0 {
		return "default (one per CPU)"
	}
	return fmt.Sprint(n)
}
