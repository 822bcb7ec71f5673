package xds

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestRunTwice: a second Run while the first is running (here, retrying a
// refused address) is refused. Client behaviour against a server is tested
// in internal/controlplane/xdsserver, whose server this package cannot
// import.
func TestRunTwice(t *testing.T) {
	c, err := NewClient(ClientConfig{Address: "127.0.0.1:1", Insecure: true, Sink: newFakeSink(), Node: testNode,
		MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testkit.Eventually(t, waitTimeout, "running", func() bool { return c.running.Load() })
	if err := c.Run(context.Background()); err != ErrAlreadyRunning {
		t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestNewClientValidates(t *testing.T) {
	_, err := NewClient(ClientConfig{})
	if err == nil {
		t.Fatal("empty config accepted")
	}
	for _, want := range []string{"Address", "Sink", "PodName", "PodNamespace", "InstanceIPs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	// Istio's XDS_ADDRESS form.
	c, err := NewClient(ClientConfig{Address: "https://istiod.istio-system.svc:15012", Sink: newFakeSink(), Node: testNode})
	if err != nil {
		t.Fatal(err)
	}
	if c.cfg.Address != "istiod.istio-system.svc:15012" {
		t.Errorf("https:// address kept as %q", c.cfg.Address)
	}
	// Two clients sharing one registry collide.
	reg := prometheus.NewRegistry()
	cfg := ClientConfig{Address: "127.0.0.1:1", Sink: newFakeSink(), Node: testNode, Registerer: reg}
	if _, err := NewClient(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClient(cfg); err == nil {
		t.Error("second client registered the same metrics without error")
	}
}
