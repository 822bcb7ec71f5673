package agent

import (
	"fmt"
	"os"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// tcpMigrateReq is net.ipv4.tcp_migrate_req, a per-network-namespace sysctl.
const tcpMigrateReq = "/proc/sys/net/ipv4/tcp_migrate_req"

// KernelPodSysctls sets, inside a captured pod's network namespace, what a
// node proxy upgrade without lost connections needs: net.ipv4.tcp_migrate_req=1.
// A new node proxy binds the pod's listeners beside the old one's
// (SO_REUSEPORT); when the old one closes its listeners on SIGTERM, the
// connections still queued on them (handshake done, not yet accepted)
// would be reset; with the sysctl the kernel hands them to the new
// listener. The node proxy tries to set it itself, but it runs
// unprivileged with a read-only /proc/sys, so on a real node only the
// privileged agent can.
func KernelPodSysctls(ns *netns.Handle) error {
	return ns.Do(func() error {
		// /proc/sys/net resolves against the calling thread's namespace,
		// which Do has switched to the pod's.
		if err := os.WriteFile(tcpMigrateReq, []byte("1"), 0); err != nil {
			return fmt.Errorf("agent: net.ipv4.tcp_migrate_req in pod netns %s: %w", ns, err)
		}
		return nil
	})
}
