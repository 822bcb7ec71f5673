package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// connectsPerPath connections are made per path, in alternated blocks.
const (
	connectsPerPath = 500
	connectBlock    = 50
)

// connectResult holds, per connect path, connect + first byte and
// connect() alone, per connection.
type connectResult struct {
	total, dial map[string][]time.Duration
}

// The connect paths. All reach the greeter in a server pod.
const (
	connDirect      = "direct"      // direct client → outside address
	connPassthrough = "passthrough" // captured client → outside address, node0's proxy passes it through
	connHBONE       = "hbone"       // captured client → captured server, HBONE through both proxies
	connPeer        = "peer"        // direct client → node0 HAProxy → mTLS → node1 HAProxy → direct server
)

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p/100)]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// added is the median connection set-up of path name minus the direct
// path's, in µs.
func (c connectResult) added(name string) float64 {
	return us(median(c.total[name]) - median(c.total[connDirect]))
}

// connects measures connection set-up to the greeter: from the start of
// connect() until the server's first byte arrives, on each connect path in
// alternated blocks. The greeter speaks first, so the time covers the whole
// path: a captured client's connect() completes against its node proxy's
// in-pod listener at once (and the peer's against node0's HAProxy), and
// only the first byte proves the proxies' own connections are up.
func (b *bench) connects(ctx context.Context) (connectResult, error) {
	r := connectResult{total: map[string][]time.Duration{}, dial: map[string][]time.Duration{}}
	type conn struct {
		name   string
		client *testcluster.Pod
		dst    string
	}
	port := fmt.Sprintf(":%d", greeterPort)
	paths := []conn{
		{connPassthrough, b.meshClient, outsideIP + port},
		{connDirect, b.directClient, outsideIP + port},
		{connHBONE, b.meshClient, b.meshServer.IP.String() + port},
	}
	if b.peer != nil {
		paths = append(paths, conn{connPeer, b.directClient, b.peer.addr.String() + port})
	}
	if b.profileDir != "" {
		defer b.profileProxies("connect", 3)()
	}
	for block := 0; block < connectsPerPath/connectBlock; block++ {
		for _, p := range rotate(paths, block) {
			for i := 0; i < connectBlock; i++ {
				dial, total, err := connectOnce(ctx, p.client, p.dst)
				if err != nil {
					return r, fmt.Errorf("connect %s %s → %s: %w", p.name, p.client.Namespace, p.dst, err)
				}
				r.total[p.name], r.dial[p.name] = append(r.total[p.name], total), append(r.dial[p.name], dial)
			}
		}
	}
	for _, p := range paths {
		logf("connect+first byte %-11s %s (%d): median %.0f µs, p90 %.0f µs; connect() alone %.0f µs", p.name, p.dst, connectsPerPath,
			us(median(r.total[p.name])), us(pct(r.total[p.name], 90)), us(median(r.dial[p.name])))
	}
	return r, nil
}

func connectOnce(ctx context.Context, client *testcluster.Pod, dst string) (dial, total time.Duration, err error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	c, err := client.Dial(cctx, "tcp", dst)
	if err != nil {
		return 0, 0, err
	}
	dial = time.Since(start)
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var one [1]byte
	if _, err := io.ReadFull(c, one[:]); err != nil {
		return 0, 0, fmt.Errorf("reading the greeting: %w", err)
	}
	return dial, time.Since(start), nil
}

// serveGreeter runs a TCP server on port of pod p (all addresses) that
// writes one byte to every connection and closes it, until tb's cleanups.
func serveGreeter(tb testkit.TB, p *testcluster.Pod, port int) error {
	ln, err := p.Listen(fmt.Sprintf(":%d", port))
	if err != nil {
		return fmt.Errorf("greeter in %s/%s: %w", p.Namespace, p.Name, err)
	}
	tb.Cleanup(func() { ln.Close() }) // registered after the cluster's: runs before its teardown
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte{'!'})
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			go func() {
				// Wait for the client's close so the server is not the side
				// left in TIME_WAIT.
				_, _ = io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return nil
}
