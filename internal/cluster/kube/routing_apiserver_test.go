package kube

import (
	"context"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// TestSourceReadsIstioRouting: VirtualServices and DestinationRules are
// read kinds in Kubernetes mode (the chart's CRDs), whichever served
// version a user applies them at (v1beta1 here for the VirtualService);
// Istio's Go-form durations come through; they are not reported as ignored.
func TestSourceReadsIstioRouting(t *testing.T) {
	api, clients, ctx := startAPI(t)
	const docs = `
apiVersion: networking.istio.io/v1beta1
kind: VirtualService
metadata: {namespace: app, name: reviews}
spec:
  hosts: [reviews]
  http: [{timeout: 3s, route: [{destination: {host: reviews, subset: v1}, weight: 90}, {destination: {host: reviews, subset: v2}, weight: 10}]}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {namespace: app, name: reviews}
spec:
  host: reviews
  trafficPolicy: {outlierDetection: {consecutive5xxErrors: 3, baseEjectionTime: 3m}}
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
`
	if err := api.Apply(ctx, []byte(docs), kubeapi.ApplyOptions{}); err != nil {
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
	objs := waitFor(t, src, "the VirtualService and DestinationRule", func(o *cluster.Objects) bool {
		return len(o.VirtualServices) == 1 && len(o.DestinationRules) == 1
	})
	vs, dr := objs.VirtualServices[0], objs.DestinationRules[0]
	if r := vs.Spec.GetHttp()[0].GetRoute(); len(r) != 2 || r[1].GetWeight() != 10 || r[1].GetDestination().GetSubset() != "v2" ||
		vs.Spec.GetHttp()[0].GetTimeout().AsDuration() != 3*time.Second {
		t.Errorf("VirtualService spec %v", vs.Spec.GetHttp())
	}
	if d := dr.Spec.GetTrafficPolicy().GetOutlierDetection().GetBaseEjectionTime().AsDuration(); d != 3*time.Minute || len(dr.Spec.GetSubsets()) != 2 {
		t.Errorf("DestinationRule spec %v", dr.Spec.GetTrafficPolicy())
	}
	for _, o := range objs.Ignored {
		if o.Kind == "VirtualService" || o.Kind == "DestinationRule" {
			t.Errorf("%s reported as ignored", o.Kind)
		}
	}
}
