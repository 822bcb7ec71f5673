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

type connectResult struct {
	mesh, direct []time.Duration // connect + first byte, per connection
	meshDial     []time.Duration // connect() alone
	directDial   []time.Duration
}

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

// added is the median connection set-up of the mesh path minus the direct
// path's, in µs.
func (c connectResult) added() float64 { return us(median(c.mesh) - median(c.direct)) }

// connects measures connection set-up to the greeter on the address outside
// the mesh: from the start of connect() until the server's first byte
// arrives. The greeter speaks first, so the time covers the whole path: a
// captured client's connect() completes against its node proxy's in-pod
// listener at once, and only the first byte proves the proxy's own
// connection to the destination is up.
func (b *bench) connects(ctx context.Context) (connectResult, error) {
	var r connectResult
	dst := fmt.Sprintf("%s:%d", outsideIP, greeterPort)
	if b.profileDir != "" {
		defer b.profileProxies("connect", 3)()
	}
	for block := 0; block < connectsPerPath/connectBlock; block++ {
		order := []bool{true, false}
		if block%2 == 1 {
			order = []bool{false, true}
		}
		for _, isMesh := range order {
			client := b.directClient
			if isMesh {
				client = b.meshClient
			}
			for i := 0; i < connectBlock; i++ {
				dial, total, err := connectOnce(ctx, client, dst)
				if err != nil {
					return r, fmt.Errorf("connect %s → %s: %w", client.Namespace, dst, err)
				}
				if isMesh {
					r.mesh, r.meshDial = append(r.mesh, total), append(r.meshDial, dial)
				} else {
					r.direct, r.directDial = append(r.direct, total), append(r.directDial, dial)
				}
			}
		}
	}
	logf("connect+first byte to %s (%d per path): mesh median %.0f µs p90 %.0f µs, direct median %.0f µs p90 %.0f µs; connect() alone: mesh %.0f µs, direct %.0f µs",
		dst, connectsPerPath, us(median(r.mesh)), us(pct(r.mesh, 90)), us(median(r.direct)), us(pct(r.direct, 90)),
		us(median(r.meshDial)), us(median(r.directDial)))
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
