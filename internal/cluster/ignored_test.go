package cluster

import (
	"errors"
	"testing"
)

// TestIgnoredKinds: Istio kinds the control plane does not read are kept
// (identity only) for reporting, survive Items/Add as a source rebuilds a
// set, and are not errors; a kind nobody knows still is ErrUnsupportedKind.
func TestIgnoredKinds(t *testing.T) {
	doc := `apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews}
spec: {egress: [{hosts: ["./*"]}]}
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: mesh-default, namespace: istio-system}
spec: {}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
`
	var o Objects
	errs := Decode("f.yaml", []byte(doc), &o)
	if len(errs) != 1 || !errors.Is(errs[0], ErrUnsupportedKind) {
		t.Fatalf("errors %v, want only the Deployment's ErrUnsupportedKind", errs)
	}
	o.Sort()
	if len(o.Ignored) != 2 || *o.Ignored[1] != (IgnoredObject{"networking.istio.io/v1", "Sidecar", "default", "reviews"}) ||
		*o.Ignored[0] != (IgnoredObject{"networking.istio.io/v1alpha3", "EnvoyFilter", "istio-system", "mesh-default"}) {
		t.Fatalf("ignored %+v", o.Ignored)
	}
	var rebuilt Objects
	keys := map[string]bool{}
	for _, it := range o.Items() {
		keys[it.Key] = true
		rebuilt.Add(it.Obj)
	}
	if !keys["Sidecar/default/reviews"] || !keys["EnvoyFilter/istio-system/mesh-default"] || len(rebuilt.Ignored) != 2 {
		t.Fatalf("items %v, rebuilt %+v", keys, rebuilt.Ignored)
	}
}
