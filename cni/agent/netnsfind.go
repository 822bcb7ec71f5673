package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// NetnsDir is where named network namespaces are bound (`ip netns`, CNI
// runtimes such as containerd use /var/run/netns/cni-*).
const NetnsDir = "/var/run/netns"

// ErrNetnsNotFound is returned (wrapped) by ScanNetns when no namespace
// holds any of the pod's IPs.
var ErrNetnsNotFound = errors.New("no network namespace holds the pod's IPs")

// ScanNetns finds the network namespace of a running pod the agent never
// saw in a CNI ADD (ambient-protocol.md §3.4 step 1): it tries hint (a path
// learned earlier), then every named namespace under NetnsDir, then every
// process's /proc/PID/ns/net, and returns the first namespace, other than
// self (the agent's own, i.e. the node's), that has one of ips on an
// interface. The caller owns the returned handle.
//
// Istio matches /proc entries by cgroup to the pod UID before checking the
// IPs; without containers (local mode) the IP check alone decides, which is
// sound because pod IPs are unique on a node.
func ScanNetns(ctx context.Context, ips []netip.Addr, hint string, self netns.ID) (string, *netns.Handle, error) {
	if len(ips) == 0 {
		return "", nil, fmt.Errorf("agent: find netns: pod has no IPs: %w", ErrNetnsNotFound)
	}
	var candidates []string
	if hint != "" {
		candidates = append(candidates, hint)
	}
	if entries, err := os.ReadDir(NetnsDir); err == nil {
		for _, e := range entries {
			candidates = append(candidates, filepath.Join(NetnsDir, e.Name()))
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	candidates = append(candidates, procs...)
	seen := map[netns.ID]bool{self: true}
	for _, path := range candidates {
		if ctx.Err() != nil {
			return "", nil, ctx.Err()
		}
		var st syscall.Stat_t
		if syscall.Stat(path, &st) != nil {
			continue
		}
		id := netns.ID{Dev: st.Dev, Ino: st.Ino}
		if seen[id] {
			continue
		}
		seen[id] = true
		h, err := netns.Open(path)
		if err != nil {
			continue
		}
		if h.ID() != id { // replaced between stat and open
			h.Close()
			continue
		}
		if holdsAny(h, ips) {
			return path, h, nil
		}
		h.Close()
	}
	return "", nil, fmt.Errorf("agent: find netns for %v: %w", ips, ErrNetnsNotFound)
}

// holdsAny reports whether one of ips is an address of an interface in h.
func holdsAny(h *netns.Handle, ips []netip.Addr) bool {
	found := false
	_ = h.Do(func() error {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && slices.Contains(ips, ip.Unmap()) {
				found = true
				return nil
			}
		}
		return nil
	})
	return found
}
