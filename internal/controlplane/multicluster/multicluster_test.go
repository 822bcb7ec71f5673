package multicluster

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestReadyBoundedWhenSecretsUnreadable: with its own API server out of
// reach (nothing listens on the port), the secrets never sync, Current has
// no remote, and Ready holds readiness for SyncTimeout only.
func TestReadyBoundedWhenSecretsUnreadable(t *testing.T) {
	kc, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 500 * time.Millisecond
	c, err := New(Config{Kube: kc, Namespace: "istio-system", ClusterID: "east", SyncTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	if c.Ready() {
		t.Fatal("ready before Run")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	start := time.Now()
	testkit.Eventually(t, 10*time.Second, "ready after the sync timeout", c.Ready)
	if since := time.Since(start); since < timeout/2 {
		t.Fatalf("ready after %v, before the secrets were read and before the %v timeout", since, timeout)
	}
	if rc, _ := c.Current(); rc != nil {
		t.Fatalf("remote clusters without secrets: %v", rc)
	}
}
