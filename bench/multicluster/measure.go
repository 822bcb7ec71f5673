package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/hbone"
)

// reqSize is the request and response of the reused-connection figure.
const reqSize = 1 << 10

type options struct {
	rounds   int // alternating rounds
	connects int // new connections per path per round
	requests int // requests per path per round on a reused connection
}

// opener opens one connection of a path to the echo app, ready for bytes.
type opener func(ctx context.Context) (net.Conn, error)

// prepare readies one new connection of a path: the opener is timed,
// the preparation and the cleanup (making and closing a pool for the one
// connection) are not.
type prepare func() (opener, func(), error)

// newPath is one way to open a new connection.
type newPath struct {
	name    string
	figure  string // the figure's name without "_added_us"
	open    prepare
	samples []time.Duration
}

// results holds every sample, sorted by print.
type results struct {
	newConn      []*newPath
	reused       []*reusedPath
	crossTunnels int // cross-network tunnels opened (each one outer stream at the gateway)
}

type reusedPath struct {
	name    string
	conn    net.Conn
	samples []time.Duration
}

// measure alternates the paths round by round (the order rotating, so no
// path always follows the same one) and keeps every sample.
func measure(ctx context.Context, cl *client, o options) (*results, error) {
	res := &results{}
	// Pools kept for the whole run: the "warm" paths find their HBONE
	// connection (same network) or outer connection to the gateway (cross
	// network) already open, as a busy node proxy would.
	warmSame, err := cl.pool()
	if err != nil {
		return nil, err
	}
	defer warmSame.Close()
	warmCross, err := cl.pool()
	if err != nil {
		return nil, err
	}
	defer warmCross.Close()
	// fresh makes a pool for the one connection before the clock starts
	// (no HBONE connection open: a full handshake, or two across networks)
	// and closes it after.
	fresh := func(open func(context.Context, *hbone.Pool) (*hbone.Tunnel, error)) prepare {
		return func() (opener, func(), error) {
			p, err := cl.pool()
			if err != nil {
				return nil, nil, err
			}
			return func(ctx context.Context) (net.Conn, error) { return open(ctx, p) }, func() { p.Close() }, nil
		}
	}
	warm := func(p *hbone.Pool, open func(context.Context, *hbone.Pool) (*hbone.Tunnel, error)) prepare {
		return func() (opener, func(), error) {
			return func(ctx context.Context) (net.Conn, error) { return open(ctx, p) }, func() {}, nil
		}
	}
	res.newConn = []*newPath{
		{name: "direct", open: func() (opener, func(), error) {
			return func(ctx context.Context) (net.Conn, error) { return dialDirect(ctx, cl.app) }, func() {}, nil
		}},
		{name: "same_network", figure: "mc_same_network_new_conn", open: fresh(cl.same)},
		{name: "same_network_warm", figure: "mc_same_network_new_stream", open: warm(warmSame, cl.same)},
		{name: "cross_network", figure: "mc_cross_network_new_conn", open: fresh(cl.cross)},
		{name: "cross_network_warm_outer", figure: "mc_cross_network_new_conn_warm_outer", open: warm(warmCross, cl.cross)},
	}
	isCross := func(name string) bool { return strings.HasPrefix(name, "cross") }

	// The reused connections, opened once.
	direct, err := dialDirect(ctx, cl.app)
	if err != nil {
		return nil, err
	}
	same, err := cl.same(ctx, warmSame)
	if err != nil {
		return nil, fmt.Errorf("same network: %w", err)
	}
	cross, err := cl.cross(ctx, warmCross)
	if err != nil {
		return nil, fmt.Errorf("cross network: %w", err)
	}
	res.crossTunnels++
	res.reused = []*reusedPath{{name: "direct", conn: direct}, {name: "same_network", conn: same}, {name: "cross_network", conn: cross}}
	defer func() {
		for _, r := range res.reused {
			r.conn.Close()
		}
	}()
	req, resp := make([]byte, reqSize), make([]byte, reqSize)
	for i := range req {
		req[i] = byte(i)
	}
	for _, r := range res.reused { // warm up
		for range 100 {
			if err := exchange(r.conn, req, resp); err != nil {
				return nil, fmt.Errorf("%s warm-up: %w", r.name, err)
			}
		}
	}
	if _, err := connectOnce(ctx, res.newConn[0]); err != nil { // warm up the dialer
		return nil, err
	}

	for round := range o.rounds {
		var line []string
		for k := range res.newConn {
			p := res.newConn[(k+round)%len(res.newConn)]
			s := make([]time.Duration, 0, o.connects)
			for range o.connects {
				d, err := connectOnce(ctx, p)
				if err != nil {
					return nil, fmt.Errorf("round %d %s new connection: %w", round, p.name, err)
				}
				s = append(s, d)
				if isCross(p.name) {
					res.crossTunnels++
				}
			}
			p.samples = append(p.samples, s...)
			slices.Sort(s)
			line = append(line, fmt.Sprintf("%s %.0f", p.name, us(benchkit.Percentile(s, 50))))
		}
		logf("round %d new connection + first byte p50 µs: %s", round, strings.Join(line, ", "))
		line = nil
		for k := range res.reused {
			r := res.reused[(k+round)%len(res.reused)]
			s := make([]time.Duration, 0, o.requests)
			for range o.requests {
				t0 := time.Now()
				if err := exchange(r.conn, req, resp); err != nil {
					return nil, fmt.Errorf("round %d %s request: %w", round, r.name, err)
				}
				s = append(s, time.Since(t0))
			}
			r.samples = append(r.samples, s...)
			slices.Sort(s)
			line = append(line, fmt.Sprintf("%s %.0f", r.name, us(benchkit.Percentile(s, 50))))
		}
		logf("round %d 1 KiB request on a reused connection p50 µs: %s", round, strings.Join(line, ", "))
	}
	return res, nil
}

// connectOnce opens a connection on p, exchanges one byte with the app,
// and returns the time from the start of the open to the echoed byte.
func connectOnce(ctx context.Context, p *newPath) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, got := []byte{7}, make([]byte, 1)
	open, cleanup, err := p.open()
	if err != nil {
		return 0, err
	}
	defer cleanup()
	t0 := time.Now()
	c, err := open(ctx)
	if err != nil {
		return 0, err
	}
	c.SetDeadline(t0.Add(10 * time.Second))
	err = exchange(c, b, got)
	d := time.Since(t0)
	c.Close()
	return d, err
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

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// print emits the figures: each path's percentile minus direct's, then
// cross network minus same network as Istio compares them.
func (r *results) print() {
	pct := func(s []time.Duration, p float64) time.Duration {
		slices.Sort(s)
		return benchkit.Percentile(s, p)
	}
	direct := r.newConn[0].samples
	for _, p := range r.newConn {
		logf("new connection + first byte, %s: p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, mean %.0f µs (%d samples)",
			p.name, us(pct(p.samples, 50)), us(pct(p.samples, 90)), us(pct(p.samples, 99)), us(mean(p.samples)), len(p.samples))
	}
	for _, p := range r.newConn[1:] {
		emit(p.figure+"_added_us", us(pct(p.samples, 50)-pct(direct, 50)), "us")
		emit(p.figure+"_added_p90_us", us(pct(p.samples, 90)-pct(direct, 90)), "us")
	}
	direct = r.reused[0].samples
	for _, p := range r.reused {
		logf("1 KiB request on a reused connection, %s: p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, mean %.0f µs (%d samples)",
			p.name, us(pct(p.samples, 50)), us(pct(p.samples, 90)), us(pct(p.samples, 99)), us(mean(p.samples)), len(p.samples))
	}
	for _, p := range r.reused[1:] {
		emit(fmt.Sprintf("mc_%s_reused_req_added_us", p.name), us(pct(p.samples, 50)-pct(direct, 50)), "us")
		emit(fmt.Sprintf("mc_%s_reused_req_added_p99_us", p.name), us(pct(p.samples, 99)-pct(direct, 99)), "us")
	}
	// Istio's published figures are pods in two clusters minus pods in one,
	// averages, with the node proxies' pools warm (outer connection to the
	// gateway, connection to the destination's node): a new connection is
	// then a new stream on one network and an inner handshake across.
	newConn := map[string][]time.Duration{}
	for _, p := range r.newConn {
		newConn[p.name] = p.samples
	}
	crossNew, sameNew := newConn["cross_network_warm_outer"], newConn["same_network_warm"]
	emit("mc_cross_minus_same_new_conn_us", us(pct(crossNew, 50)-pct(sameNew, 50)), "us")
	emit("mc_cross_minus_same_new_conn_mean_us", us(mean(crossNew)-mean(sameNew)), "us")
	crossReq, sameReq := r.reused[2].samples, r.reused[1].samples
	emit("mc_cross_minus_same_reused_req_us", us(pct(crossReq, 50)-pct(sameReq, 50)), "us")
	emit("mc_cross_minus_same_reused_req_mean_us", us(mean(crossReq)-mean(sameReq)), "us")
}

func mean(s []time.Duration) time.Duration {
	if len(s) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return sum / time.Duration(len(s))
}
