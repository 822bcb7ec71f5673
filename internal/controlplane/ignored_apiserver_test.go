package controlplane

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestIgnoredKindsInKubernetesMode: in Kubernetes mode (a real API server,
// the source as ztunnel-cp wires it) a TCPRoute, a kind the control plane
// does not read, is logged once at warning and listed in the config dump's
// ignored section, also across later translations.
func TestIgnoredKindsInKubernetesMode(t *testing.T) {
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := api.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	if err := api.EnsureNamespace(ctx, "app", map[string]string{"istio.io/dataplane-mode": "ambient"}); err != nil {
		t.Fatal(err)
	}
	const route = `
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {namespace: app, name: reviews-split}
spec:
  parentRefs: [{kind: Service, group: "", name: reviews}]
  rules: [{backendRefs: [{name: reviews, port: 9080}]}]
`
	if err := api.Apply(ctx, []byte(route), kubeapi.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	clients, err := kube.NewClients(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	src, err := kube.New(kube.Config{Clients: clients, WatchIgnored: true, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	cp := newTestCP(t, src, zap.New(core))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = cp.Run(rctx, lis); close(done) }()
	t.Cleanup(func() { stop(); <-done })

	const want = "TCPRoute app/reviews-split (gateway.networking.k8s.io/v1): "
	reported := func() bool {
		return slices.ContainsFunc(cp.ConfigDump().Ignored, func(l string) bool { return strings.HasPrefix(l, want) })
	}
	testkit.EventuallyErr(t, 30*time.Second, "the ReferenceGrant in the config dump's ignored section", func() error {
		if !reported() {
			return fmt.Errorf("ignored = %q, want a line starting %q", cp.ConfigDump().Ignored, want)
		}
		return nil
	})
	// A later change translates again; the route is not warned about twice.
	gen := cp.ConfigDump().Generation
	if err := api.EnsureNamespace(ctx, "other", nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "a translation after a namespace was created", func() bool {
		return cp.ConfigDump().Generation != gen
	})
	if !reported() {
		t.Fatal("the TCPRoute left the ignored section on a later translation")
	}
	n := 0
	for _, e := range logs.FilterMessageSnippet("ignored object").All() {
		if e.ContextMap()["kind"] == "TCPRoute" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("TCPRoute warned %d times, want once", n)
	}
}
