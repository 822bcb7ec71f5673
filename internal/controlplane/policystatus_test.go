package controlplane

import (
	"reflect"
	"testing"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// TestPolicyStatusHook: Config.PolicyStatus (what kubestatus writes into
// the objects) gets every translation's objects and the same statuses as
// the config dump, waypoint-computed ones (VirtualService) included.
func TestPolicyStatusHook(t *testing.T) {
	cp := newTestCP(t, local.New(t.TempDir(), nil, 0), zap.NewNop())
	var gotObjs *cluster.Objects
	var got []translate.PolicyStatus
	calls := 0
	cp.cfg.PolicyStatus = func(objs *cluster.Objects, p []translate.PolicyStatus) { gotObjs, got = objs, p; calls++ }
	objs := decode(t, "a.yaml", `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: bad, namespace: demo}
spec:
  rules: [{from: [{source: {ipBlocks: [10.1.0.0/33]}}]}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: demo}
spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews}}]}]}
`)
	cp.Apply(objs)
	if calls != 1 || gotObjs != objs {
		t.Fatalf("hook called %d times with objs %p, want once with %p", calls, gotObjs, objs)
	}
	if !reflect.DeepEqual(got, cp.Result().Policies) {
		t.Fatalf("hook statuses %+v differ from the published %+v", got, cp.Result().Policies)
	}
	kinds := map[string]bool{}
	for _, p := range got {
		kinds[p.Kind] = true
		if p.Kind == "AuthorizationPolicy" && len(p.Invalid) != 1 {
			t.Fatalf("invalid value not reported: %+v", p)
		}
	}
	if !kinds["AuthorizationPolicy"] || !kinds["VirtualService"] {
		t.Fatalf("statuses %+v lack a kind", got)
	}
}
