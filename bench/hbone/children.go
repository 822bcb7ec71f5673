package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

func startChild(args ...string) (*benchkit.Child, string, error) { return startChildEnv(nil, args...) }

// startChildEnv re-executes this binary with args (a -role) and extra
// environment variables as a tracked child, and returns it with its first
// stdout line.
func startChildEnv(env []string, args ...string) (*benchkit.Child, string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(exe, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	return benchkit.StartChild(reaper, cmd)
}

// childSink echoes on 127.0.0.1:0 and prints its address.
func childSink() error {
	addr, err := serveTCP(echoConn)
	if err != nil {
		return err
	}
	fmt.Println(addr)
	io.Copy(io.Discard, os.Stdin) // until the parent goes away
	return nil
}

// childServer runs an HBONE server whose handler dials the sink (or the
// CONNECT authority when sink is empty), prints its address, and answers
// "mem" with "heap stack goroutines" and "cpu" with its CPU time in ns.
func childServer(dir, sink string) error {
	c, err := benchkit.LoadCA(dir)
	if err != nil {
		return err
	}
	sc, err := c.Issue(serverID, time.Hour)
	if err != nil {
		return err
	}
	_, addr, err := startHBONE(identity.NewStaticSource(sc), func(req *hbone.Request) (net.Conn, error) {
		if sink == "" {
			return net.Dial("tcp", req.Authority.String())
		}
		return net.Dial("tcp", sink)
	})
	if err != nil {
		return err
	}
	fmt.Println(addr)
	sc2 := bufio.NewScanner(os.Stdin)
	for sc2.Scan() {
		switch sc2.Text() {
		case "mem":
			h, s, g := memStats()
			fmt.Println(h, s, g)
		case "cpu":
			fmt.Println(int64(cpuTime()))
		}
	}
	return nil
}

func parseMem(s string) (heap, stack uint64, g int, err error) {
	_, err = fmt.Sscan(s, &heap, &stack, &g)
	return heap, stack, g, err
}

// children runs the HBONE server and the echo sink in child processes and
// gives the parent a client pool whose certificate the child server trusts.
type children struct {
	srv, sink   *benchkit.Child
	pool        *hbone.Pool
	hop, target netip.AddrPort
	dir         string
}

func startChildren() (*children, error) {
	c, err := ca.New(ca.Options{})
	if err != nil {
		return nil, err
	}
	dir, err := tempDir()
	if err != nil {
		return nil, err
	}
	ch := &children{dir: dir}
	if err := benchkit.WriteCA(c, dir); err != nil {
		ch.stop()
		return nil, err
	}
	var sinkAddr, srvAddr string
	if ch.sink, sinkAddr, err = startChild("-role", "sink"); err != nil {
		ch.stop()
		return nil, err
	}
	if ch.srv, srvAddr, err = startChild("-role", "server", "-ca-dir", dir, "-sink", sinkAddr); err != nil {
		ch.stop()
		return nil, err
	}
	cc, err := c.Issue(clientID, time.Hour)
	if err != nil {
		ch.stop()
		return nil, err
	}
	ch.pool, err = hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: identity.NewStaticSource(cc)}})
	if err != nil {
		ch.stop()
		return nil, err
	}
	ch.hop, ch.target = netip.MustParseAddrPort(srvAddr), netip.MustParseAddrPort(sinkAddr)
	return ch, nil
}

func (ch *children) stop() {
	if ch.pool != nil {
		ch.pool.Close()
	}
	if ch.srv != nil {
		ch.srv.Stop()
	}
	if ch.sink != nil {
		ch.sink.Stop()
	}
	reaper.RemoveDir(ch.dir)
}

func idleBytes(ch *children) (client, server float64, err error) {
	p, srv, hop, target := ch.pool, ch.srv, ch.hop, ch.target
	sBefore, err := srv.Ask("mem")
	if err != nil {
		return 0, 0, err
	}
	cHeap0, cStack0, cG0 := memStats()
	tuns := make([]*hbone.Tunnel, 0, idleTunnels)
	one := []byte{7}
	for range idleTunnels {
		t, err := p.Connect(context.Background(), request(hop, target))
		if err != nil {
			return 0, 0, fmt.Errorf("tunnel %d: %w", len(tuns), err)
		}
		// One round trip: the tunnel is fully set up end to end.
		if _, err := t.Write(one); err != nil {
			return 0, 0, err
		}
		if _, err := io.ReadFull(t, one); err != nil {
			return 0, 0, err
		}
		tuns = append(tuns, t)
	}
	time.Sleep(200 * time.Millisecond) // let the last splices park
	cHeap1, cStack1, cG1 := memStats()
	sAfter, err := srv.Ask("mem")
	if err != nil {
		return 0, 0, err
	}
	sHeap0, sStack0, sG0, err := parseMem(sBefore)
	if err != nil {
		return 0, 0, err
	}
	sHeap1, sStack1, sG1, err := parseMem(sAfter)
	if err != nil {
		return 0, 0, err
	}
	n := float64(len(tuns))
	client = (float64(cHeap1+cStack1) - float64(cHeap0+cStack0)) / n
	server = (float64(sHeap1+sStack1) - float64(sHeap0+sStack0)) / n
	logf("idle %d tunnels over %d connections: client heap %+.0f B stack %+.0f B goroutines %+d per tunnel ×1000; server heap %+.0f B stack %+.0f B goroutines %+d",
		len(tuns), p.NumConns(),
		(float64(cHeap1)-float64(cHeap0))/n, (float64(cStack1)-float64(cStack0))/n, (cG1-cG0)*1000/len(tuns),
		(float64(sHeap1)-float64(sHeap0))/n, (float64(sStack1)-float64(sStack0))/n, sG1-sG0)
	for _, t := range tuns {
		t.Close()
	}
	return client, server, nil
}

// ---- helpers ----

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
