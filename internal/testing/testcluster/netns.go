package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// ErrNoNetNS is returned (wrapped) when a pod's namespace does not exist: the
// pod is pending after a failed CNI ADD, or deleted.
var ErrNoNetNS = errors.New("network namespace does not exist")

// netnsDir is where `ip netns` keeps named namespaces.
const netnsDir = "/var/run/netns"

// NetNS is one named network namespace of the cluster: the underlay, a node,
// or a pod (a host-network pod shares its node's). Its methods create sockets
// and processes inside it. Safe for concurrent use.
type NetNS struct {
	c    *Cluster
	name string

	mu sync.Mutex
	h  *netns.Handle // nil while the namespace does not exist
}

// NetNSName is the name under /var/run/netns, for `ip -n NAME` and
// `ip netns exec NAME`.
func (ns *NetNS) NetNSName() string { return ns.name }

// NetNSPath is the namespace's path, e.g. CNI_NETNS.
func (ns *NetNS) NetNSPath() string { return filepath.Join(netnsDir, ns.name) }

// Handle returns the open namespace handle, for code that takes a
// *netns.Handle (a ztunnel under test, say). The cluster owns it: do not
// Close it; it is closed when the namespace is deleted (pod Delete or Retry,
// cluster cleanup).
func (ns *NetNS) Handle() (*netns.Handle, error) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.h == nil {
		return nil, fmt.Errorf("testcluster: %s: %w", ns.name, ErrNoNetNS)
	}
	return ns.h, nil
}

// Do runs fn with the calling OS thread inside the namespace (see
// netns.Handle.Do).
func (ns *NetNS) Do(fn func() error) error {
	h, err := ns.Handle()
	if err != nil {
		return err
	}
	return h.Do(fn)
}

// Listen opens a TCP listener inside the namespace. addr is "ip:port" or
// ":port" (all addresses).
func (ns *NetNS) Listen(addr string) (net.Listener, error) {
	ap, err := parseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	h, err := ns.Handle()
	if err != nil {
		return nil, err
	}
	return h.Listen(context.Background(), ap, netns.SockOpts{})
}

// ListenPacket opens a UDP socket inside the namespace; addr as for Listen.
func (ns *NetNS) ListenPacket(addr string) (*net.UDPConn, error) {
	ap, err := parseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	h, err := ns.Handle()
	if err != nil {
		return nil, err
	}
	return h.ListenPacket(context.Background(), ap, netns.SockOpts{})
}

// Dial connects from inside the namespace. network is "tcp" or "udp"; addr
// is an "ip:port" literal (no name resolution).
func (ns *NetNS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("testcluster: dial: %w", err)
	}
	h, err := ns.Handle()
	if err != nil {
		return nil, err
	}
	return h.Dial(ctx, network, ap, netns.SockOpts{})
}

func parseAddrPort(addr string) (netip.AddrPort, error) {
	if strings.HasPrefix(addr, ":") {
		addr = "0.0.0.0" + addr
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("testcluster: listen: %w", err)
	}
	return ap, nil
}

// Exec runs argv inside the namespace (ip netns exec) and returns its
// combined output. A non-zero exit is an error that includes the output.
func (ns *NetNS) Exec(ctx context.Context, argv ...string) ([]byte, error) {
	if len(argv) == 0 {
		return nil, errors.New("testcluster: exec: empty argv")
	}
	if _, err := ns.Handle(); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, ns.c.ipPath, append([]string{"netns", "exec", ns.name}, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = waitDelay
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("testcluster: exec %q in %s: %w: %s", argv, ns.name, err, tail(out, 20))
	}
	return out, nil
}

// sysctl sets a /proc/sys/net value inside the namespace: /proc/sys/net shows
// the namespace of the thread that opens it.
func (ns *NetNS) sysctl(key, value string) error {
	return ns.Do(func() error {
		p := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			return fmt.Errorf("testcluster: sysctl %s=%s in %s: %w", key, value, ns.name, err)
		}
		return nil
	})
}

// open (re)opens the handle after the namespace was created.
func (ns *NetNS) open() error {
	h, err := netns.Open(ns.NetNSPath())
	if err != nil {
		return err
	}
	ns.mu.Lock()
	old := ns.h
	ns.h = h
	ns.mu.Unlock()
	return old.Close()
}

// close drops the handle so the namespace can go away once deleted.
func (ns *NetNS) close() {
	ns.mu.Lock()
	h := ns.h
	ns.h = nil
	ns.mu.Unlock()
	_ = h.Close()
}

// tail returns the last n lines of out.
func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
