package kube

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// A minimal Sidecar CRD: the chart does not ship the CRDs of kinds the
// control plane does not read, so a cluster may or may not have it; the test
// installs it only after the source started.
const sidecarCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: sidecars.networking.istio.io
spec:
  group: networking.istio.io
  names: {kind: Sidecar, plural: sidecars, singular: sidecar, listKind: SidecarList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

func ignoredNames(o *cluster.Objects) []string {
	var out []string
	for _, i := range o.Ignored {
		out = append(out, i.APIVersion+" "+i.Kind+" "+i.Namespace+"/"+i.Name)
	}
	return out
}

// TestSourceReportsIgnoredKinds: with WatchIgnored, objects of kinds the
// control plane does not read (here a Gateway API TCPRoute and an Istio
// Sidecar) enter the published set as Ignored, by identity; a kind
// whose CRD is missing does not hold back Synced, and is picked up once its
// CRD is installed; a deleted object leaves the set.
func TestSourceReportsIgnoredKinds(t *testing.T) {
	old := ignoredRediscover
	ignoredRediscover = 200 * time.Millisecond
	t.Cleanup(func() { ignoredRediscover = old })
	api, clients, ctx := startAPI(t)
	route := `
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
	src, err := New(Config{Clients: clients, WatchIgnored: true})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		if err := src.Run(runCtx); err != nil {
			t.Errorf("Run: %v", err)
		}
		close(done)
	}()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-src.Synced():
	case <-time.After(30 * time.Second):
		t.Fatal("not synced: a kind without a CRD (Sidecar) must not hold the source back")
	}
	wantRoute := "gateway.networking.k8s.io/v1 TCPRoute app/reviews-split"
	waitFor(t, src, "the TCPRoute reported as ignored", func(o *cluster.Objects) bool {
		return slices.Contains(ignoredNames(o), wantRoute)
	})

	if err := api.Apply(ctx, []byte(sidecarCRD), kubeapi.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := api.WaitCRDsEstablished(ctx, "sidecars.networking.istio.io"); err != nil {
		t.Fatal(err)
	}
	vs := `
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {namespace: app, name: reviews}
spec:
  egress: [{hosts: ["./*"]}]
`
	if err := api.Apply(ctx, []byte(vs), kubeapi.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	wantVS := "networking.istio.io/v1 Sidecar app/reviews"
	waitFor(t, src, "the Sidecar reported as ignored (CRD installed after start)", func(o *cluster.Objects) bool {
		return slices.Contains(ignoredNames(o), wantVS)
	})

	routes := schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "tcproutes"}
	if err := api.Dynamic().Resource(routes).Namespace("app").Delete(ctx, "reviews-split", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	objs := waitFor(t, src, "the deleted TCPRoute gone from Ignored", func(o *cluster.Objects) bool {
		return !slices.Contains(ignoredNames(o), wantRoute)
	})
	if got := ignoredNames(objs); !slices.Equal(got, []string{wantVS}) {
		t.Fatalf("Ignored = %v, want only %q", got, wantVS)
	}
}
