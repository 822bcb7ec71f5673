package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// reaper holds the child processes and temporary directories this process
// still owns, so a signal can clean them up (normal paths stop and remove
// them with defers; children also get SIGKILL through Pdeathsig).
var reaper = &benchkit.Reaper{}

func tempDir() (string, error) { return reaper.TempDir("bench-hbone-") }

// ---- the tunnel chain: app → proxy A → mTLS → proxy B → app ----

// chain is one app → proxy A → mTLS → proxy B → app path on loopback whose
// two proxies are child processes.
type chain struct {
	name string
	// sink and echo are proxy A's plain-TCP listeners, forwarded to the
	// parent's sink and echo applications.
	sink, echo string
	pids       [2]int // proxy A, proxy B
	stops      []func()
}

func (c *chain) stop() {
	for i := len(c.stops) - 1; i >= 0; i-- {
		c.stops[i]()
	}
	c.stops = nil
}

// cpu is both proxies' CPU time so far.
func (c *chain) cpu() (time.Duration, error) {
	var sum time.Duration
	for _, pid := range c.pids {
		t, err := benchkit.CPU(pid)
		if err != nil {
			return 0, fmt.Errorf("%s proxy CPU: %w", c.name, err)
		}
		sum += t
	}
	return sum, nil
}

// threadsEnv is the environment that gives our proxies threads OS threads
// running Go code (0: Go's default, one per CPU).
func threadsEnv(threads int) []string {
	if threads <= 0 {
		return nil
	}
	return []string{"GOMAXPROCS=" + strconv.Itoa(threads)}
}

// startHBONEChain runs our pair: proxy A (role front: plain TCP in, one
// HBONE tunnel per connection out through a hbone.Pool, spliced with
// hbone.Splice as the node proxy's outbound path does) and proxy B (role
// server: hbone.Server, whose handler dials the CONNECT authority).
func startHBONEChain(e *env, dir string, threads int) (*chain, error) {
	if err := benchkit.WriteCA(e.ca, dir); err != nil {
		return nil, err
	}
	c := &chain{name: "hbone"}
	back, backAddr, err := startChildEnv(threadsEnv(threads), "-role", "server", "-ca-dir", dir)
	if err != nil {
		return nil, fmt.Errorf("hbone proxy B: %w", err)
	}
	c.stops = append(c.stops, back.Stop)
	front, addrs, err := startChildEnv(threadsEnv(threads), "-role", "front", "-ca-dir", dir,
		"-hop", backAddr, "-targets", e.sink.String()+","+e.echo.String())
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("hbone proxy A: %w", err)
	}
	c.stops = append(c.stops, front.Stop)
	a := strings.Fields(addrs)
	if len(a) != 2 {
		c.stop()
		return nil, fmt.Errorf("hbone proxy A printed %q, want two addresses", addrs)
	}
	c.sink, c.echo = a[0], a[1]
	c.pids = [2]int{front.PID(), back.PID()}
	return c, nil
}

// childFront is proxy A of our chain: for each target in the
// comma-separated list it listens on 127.0.0.1:0, and tunnels every
// accepted connection through hop to that target. It prints the listen
// addresses on one line and runs until stdin closes.
func childFront(dir, hop, targets string) error {
	c, err := benchkit.LoadCA(dir)
	if err != nil {
		return err
	}
	cc, err := c.Issue(clientID, time.Hour)
	if err != nil {
		return err
	}
	pool, err := hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: identity.NewStaticSource(cc)}})
	if err != nil {
		return err
	}
	defer pool.Close()
	next, err := netip.ParseAddrPort(hop)
	if err != nil {
		return fmt.Errorf("-hop: %w", err)
	}
	var addrs []string
	for _, t := range strings.Split(targets, ",") {
		target, err := netip.ParseAddrPort(t)
		if err != nil {
			return fmt.Errorf("-targets: %w", err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
		go func() {
			for {
				down, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					t, err := pool.Connect(context.Background(), request(next, target))
					if err != nil {
						logf("front: connect to %v via %v: %v", target, next, err)
						down.Close()
						return
					}
					hbone.Splice(t, down)
				}()
			}
		}()
	}
	fmt.Println(strings.Join(addrs, " "))
	io.Copy(io.Discard, os.Stdin) // until the parent goes away
	return nil
}
