package agent

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestPodSysctlsOnCapture: the agent sets the pod sysctls in the pod's
// netns when a CNI ADD captures it, and again on the startup
// reconciliation of a restored pod (one an older agent captured); a
// failure is logged and the pod is captured all the same.
func TestPodSysctlsOnCapture(t *testing.T) {
	for _, fail := range []bool{false, true} {
		name := "ok"
		if fail {
			name = "failing"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			p := pod("mesh", "a", "10.0.0.5", true, nil)
			e.src.set(ns("mesh", true), p)
			var (
				mu    sync.Mutex
				calls []netns.ID
			)
			cfg := e.config()
			cfg.PodSysctls = func(h *netns.Handle) error {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, h.ID())
				if fail {
					return errors.New("read-only file system")
				}
				return nil
			}
			count := func() int { mu.Lock(); defer mu.Unlock(); return len(calls) }
			e.start(cfg)
			px := e.connect("")
			px.want(t, "snapshot ")
			if _, err := e.a.CNIAdd(context.Background(), addReq(p, "10.0.0.5")); err != nil {
				t.Fatal(err)
			}
			px.want(t, "add uid-a mesh/a sa=sa-a")
			if st, _ := e.status("uid-a"); st.State != StateEnabled {
				t.Fatalf("status %+v, want enabled whatever the sysctls did", st)
			}
			// At least once: the running pod may be enrolled from the
			// source as well as from the ADD.
			n := count()
			if n == 0 {
				t.Fatal("PodSysctls not called for the capture")
			}
			self, err := netns.Open(selfNetns)
			if err != nil {
				t.Fatal(err)
			}
			defer self.Close()
			if calls[0] != self.ID() {
				t.Fatalf("PodSysctls ran on netns %v, want the pod's %v", calls[0], self.ID())
			}
			if got := e.logs.FilterMessage("setting the pod's sysctls failed; a node proxy upgrade may reset its queued connections").Len(); got != map[bool]int{false: 0, true: n}[fail] {
				t.Fatalf("%d failure lines logged for %d calls", got, n)
			}
			e.stop()

			// A restarted agent reconciling the restored pod sets them again.
			e.reconc = true
			cfg2 := e.config()
			cfg2.PodSysctls = cfg.PodSysctls
			e.start(cfg2)
			e.connect("").want(t, "add uid-a mesh/a sa=sa-a")
			testkit.Eventually(t, waitTimeout, "sysctls set by the reconciliation", func() bool { return count() > n })
		})
	}
}

// TestKernelPodSysctls: tcp_migrate_req is turned on in the pod's own
// network namespace, not in the agent's.
func TestKernelPodSysctls(t *testing.T) {
	roottest.Require(t)
	pod := netnstest.New(t, "pod")
	host, err := os.ReadFile(tcpMigrateReq)
	if err != nil {
		t.Skipf("kernel without net.ipv4.tcp_migrate_req (Linux 5.14+): %v", err)
	}
	if got := strings.TrimSpace(pod.Exec(t, "cat", tcpMigrateReq)); got != "0" {
		t.Fatalf("new netns has tcp_migrate_req=%s, want the kernel default 0", got)
	}
	if err := KernelPodSysctls(pod.Handle); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(pod.Exec(t, "cat", tcpMigrateReq)); got != "1" {
		t.Fatalf("pod netns tcp_migrate_req=%s after KernelPodSysctls, want 1", got)
	}
	if after, _ := os.ReadFile(tcpMigrateReq); string(after) != string(host) {
		t.Fatalf("the agent's own tcp_migrate_req changed from %q to %q", host, after)
	}
}
