package proxy

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
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

// metric sums the samples of the counter name whose labels include want.
func (e *podEnv) metric(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	return gatherSum(t, e.reg, name, want)
}

// waitMetric waits (bounded) until the counter reaches at least min.
func (e *podEnv) waitMetric(t *testing.T, name string, want map[string]string, min float64) {
	t.Helper()
	testkit.EventuallyErr(t, 5*time.Second, fmt.Sprintf("%s%v >= %v while the connection is open", name, want, min), func() error {
		if got := e.metric(t, name, want); got < min {
			return fmt.Errorf("it is %v", got)
		}
		return nil
	})
}

// TestFailClosedMetricsWhileOpen: a long-lived connection is counted as
// opened while it runs and its byte counters grow before it closes, on
// the spliced plain path (15001 passthrough) and on inbound HBONE (issue
// 12 item 8).
func TestFailClosedMetricsWhileOpen(t *testing.T) {
	e := newPodEnv(t)
	echo := func(t *testing.T, rw io.ReadWriter, n int) {
		t.Helper()
		data := make([]byte, n)
		if _, err := rw.Write(data); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(rw, data); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("outbound passthrough", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := e.ns.Dial(ctx, "tcp", netip.AddrPortFrom(outsideIP, 9090), netns.SockOpts{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		greeting := make([]byte, 64)
		n, err := c.Read(greeting)
		if err != nil {
			t.Fatal(err)
		}
		src := map[string]string{"reporter": "source"}
		e.waitMetric(t, "istio_tcp_connections_opened_total", src, 1)
		echo(t, c, 1000)
		e.waitMetric(t, "istio_tcp_received_bytes_total", src, 1000)
		e.waitMetric(t, "istio_tcp_sent_bytes_total", src, float64(n+1000))
		echo(t, c, 5000)
		e.waitMetric(t, "istio_tcp_received_bytes_total", src, 6000)
		e.waitMetric(t, "istio_tcp_sent_bytes_total", src, float64(n+6000))
		if got := e.metric(t, "istio_tcp_connections_closed_total", src); got != 0 {
			t.Fatalf("closed = %v before the close", got)
		}
		if got := e.metric(t, "istio_tcp_connections_opened_total", src); got != 1 {
			t.Fatalf("opened = %v, want 1", got)
		}
		c.Close()
		e.waitMetric(t, "istio_tcp_connections_closed_total", src, 1)
		if got := e.metric(t, "istio_tcp_received_bytes_total", src); got != 6000 {
			t.Errorf("received bytes after the close = %v, want 6000", got)
		}
		if got := e.metric(t, "istio_tcp_connections_opened_total", src); got != 1 {
			t.Errorf("opened after the close = %v, want 1 (not counted again)", got)
		}
	})
	t.Run("inbound hbone", func(t *testing.T) {
		tun, err := e.connect(t, "10.55.0.1:8080")
		if err != nil {
			t.Fatal(err)
		}
		defer tun.Close()
		greeting := make([]byte, 64)
		n, err := tun.Read(greeting)
		if err != nil {
			t.Fatal(err)
		}
		dst := map[string]string{"reporter": "destination", "response_flags": "-"}
		e.waitMetric(t, "istio_tcp_connections_opened_total", dst, 1)
		echo(t, tun, 3000)
		e.waitMetric(t, "istio_tcp_received_bytes_total", dst, 3000)
		e.waitMetric(t, "istio_tcp_sent_bytes_total", dst, float64(n+3000))
		echo(t, tun, 3000)
		e.waitMetric(t, "istio_tcp_received_bytes_total", dst, 6000)
		if got := e.metric(t, "istio_tcp_connections_closed_total", dst); got != 0 {
			t.Fatalf("closed = %v before the close", got)
		}
	})
}
