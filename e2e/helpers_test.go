package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/cni/zds"
	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// waitTimeout bounds every testkit.Eventually here: a guard against hangs
// on a loaded machine, not a timing assertion.
const waitTimeout = 20 * time.Second

// binDir holds the binaries the tests build, each once per test process
// (testkit.BuildBinaries); TestMain makes and removes it.
var binDir string

func TestMain(m *testing.M) {
	var err error
	if binDir, err = os.MkdirTemp("", "ztg-e2e-bin-"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(binDir)
	os.Exit(code)
}

// ztunnelCNI returns the directory holding the freshly built ztunnel-cni.
func ztunnelCNI(t *testing.T) string {
	t.Helper()
	return testkit.BuildBinaries(t, binDir, "ztunnel-cni")
}

// Namespace labels.
var (
	ambientNS = map[string]string{"istio.io/dataplane-mode": "ambient"}
	optOut    = map[string]string{"istio.io/dataplane-mode": "none"}
)

// captureCluster is a one-node cluster whose pods go through ztunnel-cni.
type captureCluster struct {
	*testcluster.Cluster
	t    *testing.T
	node *testcluster.Node
}

// newCaptureCluster builds the cluster. With pluginDir empty, every node's
// conflist chains ztunnel-cni (the freshly built binary); otherwise pods are
// wired without it until the agent's installer puts it into pluginDir and
// the node's conflist.
func newCaptureCluster(t *testing.T, pluginDir string) *captureCluster {
	t.Helper()
	roottest.Require(t)
	bin := ztunnelCNI(t)
	configDir := t.TempDir()
	opts := testcluster.Options{ConfigDir: configDir, PluginDirs: []string{bin}}
	if pluginDir != "" {
		opts.PluginDirs = []string{pluginDir}
	} else {
		opts.ExtraPlugins = func(n *testcluster.Node) []map[string]any {
			return []map[string]any{{
				"type":             "ztunnel-cni",
				"agent_socket":     filepath.Join(n.Dir, "plugin.sock"),
				"local_config_dir": configDir,
				"log_level":        "debug",
			}}
		}
	}
	c := testcluster.New(t, opts)
	return &captureCluster{Cluster: c, t: t, node: c.Node(0)}
}

// agentArgs are the flags of the node agent of n, with per-node paths.
func agentArgs(c *captureCluster, extra ...string) []string {
	n := c.node
	return append([]string{
		"--node-name", n.Name,
		"--local-config", c.ConfigDir(),
		"--zds-socket", filepath.Join(n.Dir, "zds.sock"),
		"--plugin-socket", filepath.Join(n.Dir, "plugin.sock"),
		"--state-dir", filepath.Join(n.Dir, "agent-state"),
		"--admin-addr", "127.0.0.1:8000",
		"--install=false",
		"--log-level", "debug",
	}, extra...)
}

// startAgent runs the node agent in the node's namespace and waits until it
// serves.
func (c *captureCluster) startAgent(extra ...string) *testcluster.Proc {
	c.t.Helper()
	p, err := c.node.Start(testcluster.Process{Name: "ztunnel-cni-agent", Path: filepath.Join(ztunnelCNI(c.t), "ztunnel-cni"), Args: agentArgs(c, extra...)})
	if err != nil {
		c.t.Fatal(err)
	}
	if err := p.WaitLog(ctxT(c.t, 20*time.Second), "node agent ready"); err != nil {
		c.t.Fatal(err)
	}
	return p
}

func (c *captureCluster) zdsSocket() string { return filepath.Join(c.node.Dir, "zds.sock") }

// podStatus fetches the agent's GET /pods, keyed by pod name.
func (c *captureCluster) podStatus() map[string]agent.PodStatus {
	c.t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return c.node.Dial(ctx, "tcp", "127.0.0.1:8000")
		}}}
	resp, err := client.Get("http://agent/pods")
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var pods []agent.PodStatus
	if err := json.NewDecoder(resp.Body).Decode(&pods); err != nil {
		c.t.Fatal(err)
	}
	out := map[string]agent.PodStatus{}
	for _, p := range pods {
		out[p.Name] = p
	}
	return out
}

// addPod adds a pod that must start, serving its app on appPort.
func (c *captureCluster) addPod(spec testcluster.PodSpec) *testcluster.Pod {
	c.t.Helper()
	p, err := c.node.AddPod(ctxT(c.t, 30*time.Second), spec)
	if err != nil {
		c.t.Fatalf("AddPod %s/%s: %v", spec.Namespace, spec.Name, err)
	}
	serve(c.t, p.NetNS, p.Name, []int{appPort}, nil)
	return p
}

// nat lists the pod's nat table rules (iptables -S).
func nat(t *testing.T, p *testcluster.Pod) string {
	t.Helper()
	out, err := p.Exec(ctxT(t, 10*time.Second), "iptables", "-t", "nat", "-S")
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// redirect15001 is the outbound capture rule as iptables -S prints it.
const redirect15001 = "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001"

const (
	appPort = 9090 // every pod's app
	webPort = 8080 // the server pod's extra TCP port
	dnsPort = 53
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// serve answers every TCP connection on tcpPorts and every UDP datagram on
// udpPorts of ns with "direct <name>:<port>", until the test ends.
func serve(t *testing.T, ns *testcluster.NetNS, name string, tcpPorts, udpPorts []int) {
	t.Helper()
	for _, port := range tcpPorts {
		ln, err := ns.Listen(fmt.Sprintf(":%d", port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		reply := fmt.Sprintf("direct %s:%d\n", name, port)
		go acceptLoop(ln, func(c net.Conn) { io.WriteString(c, reply) })
	}
	for _, port := range udpPorts {
		pc, err := ns.ListenPacket(fmt.Sprintf(":%d", port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go udpLoop(pc, fmt.Sprintf("direct %s:%d udp\n", name, port))
	}
}

func acceptLoop(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

func udpLoop(pc *net.UDPConn, reply string) {
	buf := make([]byte, 512)
	for {
		_, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		pc.WriteToUDPAddrPort([]byte(reply), from)
	}
}

// exchange connects from ns to dst over network ("tcp" or "udp") and
// returns the first line of the answer, or "error: ..." when there is none.
func exchange(t *testing.T, ns interface {
	Dial(context.Context, string, string) (net.Conn, error)
}, network string, dst netip.AddrPort) string {
	t.Helper()
	ctx := ctxT(t, 5*time.Second)
	c, err := ns.Dial(ctx, network, dst.String())
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if network == "udp" {
		if _, err := c.Write([]byte("q")); err != nil {
			return "error: " + err.Error()
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// standIn is a stand-in node proxy: a ZDS client that, for each pod it is
// given, opens the capture listeners (15001, 15006, 15053 TCP and UDP)
// inside the pod's namespace with ztunnel's SO_MARK, and answers each
// connection with "proxy <port> <original destination>".
type standIn struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan struct{}
	events chan string

	mu    sync.Mutex
	pods  map[string]*standInPod
	names map[string]string // uid → pod name, for events
}

type standInPod struct {
	ns      *netns.Handle
	closers []io.Closer
}

func (p *standInPod) close() {
	for _, c := range p.closers {
		c.Close()
	}
	p.ns.Close()
}

func startStandIn(t *testing.T, socket string) *standIn {
	t.Helper()
	s := &standIn{t: t, done: make(chan struct{}), events: make(chan string, 100), pods: map[string]*standInPod{}, names: map[string]string{}}
	c, err := zds.NewClient(zds.ClientConfig{Path: socket, Handler: s, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		c.Run(ctx)
	}()
	t.Cleanup(s.stop)
	return s
}

// stop disconnects and closes every listener, as a restarting proxy would.
func (s *standIn) stop() {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid, p := range s.pods {
		p.close()
		delete(s.pods, uid)
	}
}

// Add implements zds.Handler.
func (s *standIn) Add(uid string, info *zdsapi.WorkloadInfo, h *netns.Handle) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names[uid] = info.GetName()
	if old := s.pods[uid]; old != nil {
		if old.ns.ID() == h.ID() {
			h.Close()
			s.events <- "add " + info.GetName()
			return nil
		}
		old.close()
		delete(s.pods, uid)
	}
	p := &standInPod{ns: h}
	opts := netns.SockOpts{Mark: rules.ZtunnelMark}
	for _, port := range []uint16{rules.PortOutbound, rules.PortInbound, rules.PortDNS} {
		ln, err := h.Listen(context.Background(), netip.AddrPortFrom(netip.IPv4Unspecified(), port), opts)
		if err != nil {
			p.close()
			return err
		}
		p.closers = append(p.closers, ln)
		go acceptLoop(ln, func(c net.Conn) {
			dst, err := originalDst(c.(*net.TCPConn))
			if err != nil {
				fmt.Fprintf(c, "proxy %d error %v\n", port, err)
				return
			}
			fmt.Fprintf(c, "proxy %d %s\n", port, dst)
		})
	}
	// Like ztunnel's DNS proxy, bound to loopback: replies then come from
	// the address the REDIRECT sent the query to, so conntrack maps them
	// back to the original server.
	pc, err := h.ListenPacket(context.Background(), netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), rules.PortDNS), opts)
	if err != nil {
		p.close()
		return err
	}
	p.closers = append(p.closers, pc)
	go udpLoop(pc, fmt.Sprintf("proxy %d udp\n", rules.PortDNS))
	s.pods[uid] = p
	s.events <- "add " + info.GetName()
	return nil
}

// Keep implements zds.Handler.
func (s *standIn) Keep(uid string) error {
	s.events <- "keep " + uid
	return nil
}

// Del implements zds.Handler.
func (s *standIn) Del(uid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pods[uid]; p != nil {
		p.close()
		delete(s.pods, uid)
	}
	name := s.names[uid]
	if name == "" {
		name = uid
	}
	s.events <- "del " + name
	return nil
}

// SnapshotSent implements zds.Handler.
func (s *standIn) SnapshotSent(seen []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid, p := range s.pods {
		if !slices.Contains(seen, uid) {
			p.close()
			delete(s.pods, uid)
		}
	}
	s.events <- fmt.Sprintf("snapshot %d", len(seen))
	return nil
}

// wait consumes events until every one of want has arrived (in any order).
func (s *standIn) wait(want ...string) {
	s.t.Helper()
	timeout := time.After(20 * time.Second)
	var seen []string
	left := slices.Clone(want)
	for len(left) > 0 {
		select {
		case ev := <-s.events:
			if i := slices.Index(left, ev); i >= 0 {
				left = slices.Delete(left, i, i+1)
			}
			seen = append(seen, ev)
		case <-timeout:
			s.t.Fatalf("stand-in proxy: still waiting for %q; saw %q", left, seen)
		}
	}
}

// originalDst reads SO_ORIGINAL_DST (IPv4) of a redirected connection.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var dst netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		// struct sockaddr_in fits in the 20-byte ipv6_mreq buffer.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), uint16(b[2])<<8|uint16(b[3]))
	})
	return dst, errors.Join(err, serr)
}
