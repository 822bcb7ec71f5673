package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// ErrNetnsUnproven is returned (wrapped) by FindPodNetns when no network
// namespace can be proven to be the pod's: the pod is then not enrolled
// (its status says failed, with this error), because rules written into the
// wrong namespace would capture another pod under this pod's identity and
// leave this one uncaptured.
var ErrNetnsUnproven = errors.New("no network namespace can be proven to be the pod's")

// NetnsQuery is what FindPodNetns knows of a running pod.
type NetnsQuery struct {
	// UID is the pod's UID. Required.
	UID string
	// IPs are the pod's IPs from its status. When set, the namespace found
	// must hold one of them (a confirmation; an IP never picks a namespace).
	IPs []netip.Addr
	// Hint is the sandbox namespace path the runtime passed for this UID
	// in a CNI ADD (CNI_NETNS), "" if none was seen.
	Hint string
	// Self is the agent's own namespace (the node's): never a pod's.
	Self netns.ID
	// ProcRoot is the proc filesystem; "" means /proc.
	ProcRoot string
}

// FindPodNetns finds the network namespace of a running pod the agent never
// captured in a CNI ADD (docs/protocol.md#capture-rules), from evidence the
// container runtime controls, not from anything inside the pod:
//
//  1. q.Hint, the namespace path the runtime gave the plugin for this very
//     pod UID;
//  2. otherwise the pod's processes: every /proc/PID whose cgroup path names
//     the pod UID the way kubelet names pod cgroups (cgroupfs "pod<uid>",
//     systemd "…-pod<uid with _>.slice"), and their /proc/PID/ns/net. All of
//     them (outside the node's namespace) must share one namespace.
//
// The namespace found must hold one of q.IPs, when given. Anything else is
// ErrNetnsUnproven: addresses alone prove nothing, since any pod with
// NET_ADMIN can put another pod's IP on its own interfaces. The returned
// path is for logs and status; the caller owns the handle.
func FindPodNetns(ctx context.Context, q NetnsQuery) (string, *netns.Handle, error) {
	if q.UID == "" {
		return "", nil, fmt.Errorf("agent: find netns: pod has no UID: %w", ErrNetnsUnproven)
	}
	if q.ProcRoot == "" {
		q.ProcRoot = "/proc"
	}
	var hintErr error
	if q.Hint != "" {
		h, err := netns.Open(q.Hint)
		switch {
		case err != nil:
			hintErr = fmt.Errorf("sandbox namespace %s from the CNI ADD: %w", q.Hint, err)
		case h.ID() == q.Self:
			h.Close()
			hintErr = fmt.Errorf("sandbox namespace %s from the CNI ADD is the node's", q.Hint)
		default:
			if err := confirmIPs(h, q.IPs); err != nil {
				h.Close()
				hintErr = fmt.Errorf("sandbox namespace %s from the CNI ADD: %w", q.Hint, err)
				break
			}
			return q.Hint, h, nil
		}
	}
	path, h, err := findByCgroup(ctx, q)
	if err != nil {
		if hintErr != nil {
			err = fmt.Errorf("%w; %w", hintErr, err)
		}
		return "", nil, fmt.Errorf("agent: pod %s: %w", q.UID, err)
	}
	return path, h, nil
}

// findByCgroup scans the processes for the pod's cgroup.
func findByCgroup(ctx context.Context, q NetnsQuery) (string, *netns.Handle, error) {
	entries, err := os.ReadDir(q.ProcRoot)
	if err != nil {
		return "", nil, fmt.Errorf("reading %s: %w: %w", q.ProcRoot, err, ErrNetnsUnproven)
	}
	var (
		found     *netns.Handle
		foundPath string
		pids      []int
	)
	fail := func(err error) (string, *netns.Handle, error) {
		found.Close()
		return "", nil, err
	}
	for _, e := range entries {
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !inPodCgroup(q.ProcRoot, pid, q.UID) {
			continue
		}
		path := filepath.Join(q.ProcRoot, e.Name(), "ns", "net")
		h, err := netns.Open(path)
		if err != nil {
			continue // exited
		}
		// The PID may have been reused between the two reads: only a
		// process still in the pod's cgroup after the open counts.
		if !inPodCgroup(q.ProcRoot, pid, q.UID) || h.ID() == q.Self {
			h.Close()
			continue
		}
		pids = append(pids, pid)
		switch {
		case found == nil:
			found, foundPath = h, path
		case found.ID() != h.ID():
			h.Close()
			return fail(fmt.Errorf("processes of the pod's cgroup (PIDs %v) are in different network namespaces (%s, %s): %w",
				pids, found.ID(), h.ID(), ErrNetnsUnproven))
		default:
			h.Close()
		}
	}
	if found == nil {
		return "", nil, fmt.Errorf("no process in a cgroup of the pod (kubelet's pod%s or pod%s) outside the node's network namespace: %w",
			q.UID, strings.ReplaceAll(q.UID, "-", "_"), ErrNetnsUnproven)
	}
	if err := confirmIPs(found, q.IPs); err != nil {
		return fail(fmt.Errorf("network namespace of the pod's processes (PIDs %v): %w", pids, err))
	}
	return foundPath, found, nil
}

// inPodCgroup reports whether /proc/pid/cgroup places the process in a
// cgroup of the pod with uid, in kubelet's naming (any hierarchy, v1 or v2):
// a path component "pod<uid>" (cgroupfs driver) or one ending in
// "pod<uid with - replaced by _>.slice" after "-" or at its start (systemd
// driver, e.g. kubepods-burstable-pod<uid_>.slice).
func inPodCgroup(procRoot string, pid int, uid string) bool {
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return false
	}
	return cgroupNamesPod(data, uid)
}

func cgroupNamesPod(data []byte, uid string) bool {
	cgroupfs := "pod" + uid
	systemd := "pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for c := range strings.SplitSeq(parts[2], "/") {
			if c == cgroupfs || c == systemd || strings.HasSuffix(c, "-"+systemd) {
				return true
			}
		}
	}
	return false
}

// confirmIPs checks that h holds one of ips (no check without IPs).
func confirmIPs(h *netns.Handle, ips []netip.Addr) error {
	if len(ips) == 0 {
		return nil
	}
	found, err := holdsAny(h, ips)
	switch {
	case err != nil:
		return fmt.Errorf("reading its addresses: %w: %w", err, ErrNetnsUnproven)
	case !found:
		return fmt.Errorf("it holds none of the pod's IPs %v: %w", ips, ErrNetnsUnproven)
	}
	return nil
}

// holdsAny reports whether one of ips is an address of an interface in h.
func holdsAny(h *netns.Handle, ips []netip.Addr) (bool, error) {
	found := false
	err := h.Do(func() error {
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
	return found, err
}
