package proxy

import (
	"io"
	"testing"
	"time"

	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestFailClosedWorkloadGone: an inbound connection of a pod whose workload
// leaves the snapshot is closed (reason revoked), not left running with no
// policy to check it against (issue 12 item 9).
func TestFailClosedWorkloadGone(t *testing.T) {
	e := newPodEnv(t)
	tun, err := e.connect(t, "10.55.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	buf := make([]byte, 64)
	if _, err := tun.Read(buf); err != nil {
		t.Fatal(err)
	}
	if err := e.store.ApplyAddresses(nil, []string{pt.UID("apps", "pod")}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, tun)
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection of a workload that left the snapshot is still open")
	}
	waitLog(t, e.logs, map[string]string{"direction": "inbound", "dst.hbone_addr": "10.55.0.1:8080", "reason": "revoked"})
}
