package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestNftablesMigration (issue 18): a pod captured by an iptables agent is
// moved to native nftables by the agent restarted with --native-nftables,
// while connections out of and into the pod run in a loop. Every one of
// them must reach the node proxy: the new agent installs the nft tables
// before it deletes the iptables chains, so there is no moment in which the
// pod is uncaptured. The node's probe SNAT moves to nftables as well. A pod
// added afterwards gets nftables only.
func TestNftablesMigration(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("nft not found (apt package nftables, make deps): %v", err)
	}
	c := newCaptureCluster(t, "")
	agentProc := c.startAgent()
	px := startStandIn(t, c.zdsSocket())
	px.wait("snapshot 0")
	if err := c.AddNamespace("mesh", ambientNS); err != nil {
		t.Fatal(err)
	}
	srv := c.addPod(testcluster.PodSpec{Name: "srv"})
	a := c.addPod(testcluster.PodSpec{Name: "a", Namespace: "mesh"})
	px.wait("add a")
	if rs := nat(t, a); !strings.Contains(rs, redirect15001) {
		t.Fatalf("the iptables agent did not capture a:\n%s", rs)
	}
	if out := nftTables(t, a); strings.Contains(out, rules.NFTTablePrefix) {
		t.Fatalf("a has our nftables tables before the switch:\n%s", out)
	}

	out := netip.AddrPortFrom(srv.IP, appPort)
	in := netip.AddrPortFrom(a.IP, appPort)
	loop := startConnLoop([]connProbe{
		{"a → srv", a, out, proxied(rules.PortOutbound, out)},
		{"srv → a", srv, in, proxied(rules.PortInbound, in)},
	})
	loop.waitCount(t, 20) // both directions seen working before the switch

	if err := agentProc.Stop(); err != nil {
		t.Fatal(err)
	}
	agentProc = c.startAgent("--native-nftables")
	px.wait("add a", "snapshot 1") // the proxy keeps serving a throughout
	before := loop.count()
	loop.waitCount(t, before+20) // and connections keep running after
	total, bad := loop.stop()
	if len(bad) > 0 {
		t.Errorf("%d of %d connections did not reach the node proxy during the migration; first ones: %q", len(bad), total, bad[:min(5, len(bad))])
	} else {
		t.Logf("%d connections during the migration, every one through the node proxy", total)
	}

	log := string(agentProc.Log())
	for _, want := range []string{`"backend":"nftables"`, "reconcile: pod rules differ; repairing"} {
		if !strings.Contains(log, want) {
			t.Errorf("agent log lacks %q", want)
		}
	}
	if rs := nat(t, a); strings.Contains(rs, "ISTIO") {
		t.Errorf("iptables chains left in a after the migration:\n%s", rs)
	}
	// (iptables-nft keeps its chains in nftables too: none may be left.)
	if got := nftTables(t, a); !strings.Contains(got, "table inet istio-ambient-nat") ||
		!strings.Contains(got, "redirect to :15001") || strings.Contains(got, "ISTIO_") {
		t.Errorf("a's nftables tables after the migration:\n%s", got)
	}
	if st := c.podStatus()["a"]; st.State != agent.StateEnabled || st.UpToDate == nil || !*st.UpToDate {
		t.Errorf("status of a after the migration: %+v", st)
	}
	// The node side moved too: a's IP is in the nftables probe set, the
	// ipsets are gone, and a kubelet probe from the node still reaches the
	// app uncaptured.
	node, err := c.node.Exec(ctxT(t, 10*time.Second), "nft", "list", "table", "inet", rules.NFTHostTable)
	if err != nil || !strings.Contains(string(node), a.IP.String()) {
		t.Errorf("node's nftables probe table (%v):\n%s", err, node)
	}
	if sets, _ := c.node.Exec(ctxT(t, 10*time.Second), "ipset", "list", "-n"); strings.Contains(string(sets), rules.ProbeIPSetV4) {
		t.Errorf("node's ipsets after the migration:\n%s", sets)
	}
	if got := exchange(t, c.node, "tcp", in); got != direct("a", appPort) {
		t.Errorf("probe from the node after the migration: got %q, want the app", got)
	}

	// A pod created under the nftables agent never gets iptables rules.
	b := c.addPod(testcluster.PodSpec{Name: "b", Namespace: "mesh"})
	px.wait("add b")
	if rs := nat(t, b); strings.Contains(rs, "ISTIO") {
		t.Errorf("b has iptables chains:\n%s", rs)
	}
	if got := nftTables(t, b); !strings.Contains(got, "redirect to :15006") {
		t.Errorf("b's nftables tables:\n%s", got)
	}
	for _, p := range []connProbe{
		{"b → srv", b, out, proxied(rules.PortOutbound, out)},
		{"srv → b", srv, netip.AddrPortFrom(b.IP, appPort), proxied(rules.PortInbound, netip.AddrPortFrom(b.IP, appPort))},
	} {
		if got := p.exchange(); got != p.want {
			t.Errorf("%s: got %q, want %q", p.name, got, p.want)
		}
	}
}

// nftTables lists the pod's nftables ruleset.
func nftTables(t *testing.T, p *testcluster.Pod) string {
	t.Helper()
	out, err := p.Exec(ctxT(t, 10*time.Second), "nft", "list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset in %s: %v: %s", p.Name, err, out)
	}
	return strings.TrimSpace(string(out))
}

// connProbe is one connection the loop makes again and again.
type connProbe struct {
	name string
	from *testcluster.Pod
	dst  netip.AddrPort
	want string
}

// exchange is one connection: what the far end said first, or the error.
// It uses no *testing.T, so loop goroutines may call it.
func (p connProbe) exchange() string {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := p.from.Dial(ctx, "tcp", p.dst.String())
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// connLoop runs each probe back to back, one goroutine per probe, and
// records every connection whose answer was not the wanted one.
type connLoop struct {
	done  atomic.Bool
	wg    sync.WaitGroup
	n     atomic.Int64
	mu    sync.Mutex
	wrong []string
}

func startConnLoop(probes []connProbe) *connLoop {
	l := &connLoop{}
	for _, p := range probes {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for !l.done.Load() {
				got := p.exchange()
				l.n.Add(1)
				if got != p.want {
					l.mu.Lock()
					l.wrong = append(l.wrong, fmt.Sprintf("%s at %s: %s", p.name, time.Now().Format("15:04:05.000"), got))
					l.mu.Unlock()
				}
			}
		}()
	}
	return l
}

func (l *connLoop) count() int64 { return l.n.Load() }

// waitCount waits until at least n connections have been made.
func (l *connLoop) waitCount(t *testing.T, n int64) {
	t.Helper()
	testkit.EventuallyErr(t, 20*time.Second, fmt.Sprintf("%d connections of the loop", n), func() error {
		if got := l.n.Load(); got < n {
			return fmt.Errorf("%d so far", got)
		}
		return nil
	})
}

// stop ends the loop and returns how many connections it made and the
// wrong answers.
func (l *connLoop) stop() (int64, []string) {
	l.done.Store(true)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n.Load(), l.wrong
}
