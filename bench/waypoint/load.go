package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// path is one way from the client to the server app.
type path struct {
	name string
	// dial opens one client connection that carries HTTP/1.1 to the app.
	dial func(ctx context.Context) (net.Conn, error)
	// pid is the proxy process whose CPU and memory are measured (0: none).
	pid int
	// routed: the path goes through the HTTPRoute (x-route is set) and the
	// policies (the denied requests get 403).
	routed bool
	rounds []round
	maxRSS float64 // MiB, VmRSS right after each load
}

type round struct {
	p50, p90, p99 time.Duration
	rate          float64 // requests per second achieved
	vcpu          float64 // the proxy's CPU-seconds per second
}

func (r round) cpuPer1k() float64 { return r.vcpu / (r.rate / 1000) }

// clients are the client "pod"'s ways out: an HBONE pool with its workload
// identity (what its node proxy would do), and a TLS config with the same
// certificate for the HAProxy path.
type clients struct {
	pool *hbone.Pool
	tls  *tls.Config
}

func newClients(certs *identity.StaticSource, wc *identity.WorkloadCertificate, roots *x509.CertPool) (*clients, error) {
	pool, err := hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: certs}})
	if err != nil {
		return nil, err
	}
	return &clients{pool: pool, tls: &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{wc.TLS},
		// The server's certificate names a SPIFFE ID, not a host: verify the
		// chain instead of the name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no server certificate")
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			return err
		},
	}}, nil
}

// tunnel dials an HBONE tunnel from the client to hop for authority, as
// the client's node proxy would (expecting the peer identity dst).
func (c *clients) tunnel(hop, authority string, dst identity.Identity) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		return c.pool.Connect(ctx, &hbone.ConnectRequest{
			Key: hbone.Key{Src: clientID, Dst: []identity.Identity{dst}, SrcIP: netip.MustParseAddr(clientIP),
				NextHop: netip.MustParseAddrPort(hop)},
			Authority: netip.MustParseAddrPort(authority),
		})
	}
}

// tlsDial dials addr from the client's address with its certificate.
func (c *clients) tlsDial(addr string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP)}}, Config: c.tls}
		return d.DialContext(ctx, "tcp", addr)
	}
}

// plainDial dials addr from the client's address.
func plainDial(addr string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP)}}
		return d.DialContext(ctx, "tcp", addr)
	}
}

// httpConn is one keep-alive HTTP/1.1 client connection.
type httpConn struct {
	c  net.Conn
	br *bufio.Reader
}

// request is an HTTP/1.1 request with a msgSize body.
func request(method, target string, body []byte) []byte {
	b := fmt.Appendf(nil, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: bench-waypoint\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n",
		method, target, svcHost, len(body))
	return append(b, body...)
}

// benchRequest is what the load sends: POST /api/echo with 1 KiB.
var benchRequest = request("POST", benchPath, make([]byte, msgSize))

// do writes req and reads the whole response; it returns the status, the
// X-Route-Seen header and the body length.
func (h *httpConn) do(req []byte) (int, string, int64, error) {
	if _, err := h.c.Write(req); err != nil {
		return 0, "", 0, err
	}
	resp, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return 0, "", 0, err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Route-Seen"), n, err
}

func open(p *path) (*httpConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", p.name, err)
	}
	return &httpConn{c: c, br: bufio.NewReaderSize(c, 4096)}, nil
}

// check proves a path does the work it is measured for: the bench request
// answers 200 with the 1 KiB body (and, through a proxy, the route's
// x-route header reached the app), and through a proxy the DENY path and a
// method the ALLOW does not name are refused with 403.
func check(p *path) error {
	h, err := open(p)
	if err != nil {
		return err
	}
	defer h.c.Close()
	h.c.SetDeadline(time.Now().Add(10 * time.Second))
	code, route, n, err := h.do(benchRequest)
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	wantRoute := ""
	if p.routed {
		wantRoute = "server-api"
	}
	if code != 200 || n != msgSize || route != wantRoute {
		return fmt.Errorf("%s: POST %s = %d, %d bytes, x-route %q; want 200, %d bytes, x-route %q", p.name, benchPath, code, n, route, msgSize, wantRoute)
	}
	if !p.routed {
		return nil
	}
	for _, req := range [][]byte{request("GET", deniedPath, nil), request("POST", deniedPath, make([]byte, msgSize)), request("GET", benchPath, nil)} {
		code, _, _, err := h.do(req)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		if code != http.StatusForbidden {
			line, _, _ := bufio.NewReader(bytes.NewReader(req)).ReadLine()
			return fmt.Errorf("%s: %q = %d, want 403 from the policies", p.name, line, code)
		}
	}
	return nil
}

// load runs conns keep-alive connections over p, each sending the bench
// request and reading its response on a fixed schedule (rate requests per
// second over all of them, staggered), for d. Latency is from the
// request's write to the last byte of its response; the proxy's CPU is
// sampled around the timed part.
func load(p *path, conns, rate int, d time.Duration) (round, error) {
	hs := make([]*httpConn, conns)
	defer func() {
		for _, h := range hs {
			if h != nil {
				h.c.Close()
			}
		}
	}()
	for i := range hs {
		h, err := open(p)
		if err != nil {
			return round{}, err
		}
		hs[i] = h
		h.c.SetDeadline(time.Now().Add(d + 30*time.Second))
		for range 20 { // warm up: every connection set up end to end
			if code, _, _, err := h.do(benchRequest); err != nil || code != 200 {
				return round{}, fmt.Errorf("%s warm-up: %d %v", p.name, code, err)
			}
		}
	}
	cpu0, err := procCPU(p.pid)
	if err != nil {
		return round{}, err
	}
	all, wall, err := benchkit.Paced(conns, rate, d, func(i int) error {
		code, _, n, err := hs[i].do(benchRequest)
		if err == nil && (code != 200 || n != msgSize) {
			err = fmt.Errorf("answer %d with %d bytes", code, n)
		}
		return err
	})
	if err != nil {
		return round{}, fmt.Errorf("%s: %w", p.name, err)
	}
	cpu1, err := procCPU(p.pid)
	if err != nil {
		return round{}, err
	}
	if len(all) == 0 {
		return round{}, fmt.Errorf("%s: no requests completed", p.name)
	}
	if p.pid != 0 {
		st, err := benchkit.Status(p.pid)
		if err != nil {
			return round{}, fmt.Errorf("%s memory: %w", p.name, err)
		}
		p.maxRSS = max(p.maxRSS, float64(st["VmRSS"])/1024)
	}
	return round{
		p50: benchkit.Percentile(all, 50), p90: benchkit.Percentile(all, 90), p99: benchkit.Percentile(all, 99),
		rate: float64(len(all)) / wall.Seconds(),
		vcpu: (cpu1 - cpu0).Seconds() / wall.Seconds(),
	}, nil
}

// procCPU is pid's CPU time, 0 for no process (the direct path).
func procCPU(pid int) (time.Duration, error) {
	if pid == 0 {
		return 0, nil
	}
	return benchkit.CPU(pid)
}
