package main

import (
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// TestAnalyzeEastWestGateway: an east-west Gateway is reported as the
// network gateway of its network when ztunnel-cp can use it, and as a
// warning naming what is missing when it cannot (its network's remote
// workloads are then refused).
func TestAnalyzeEastWestGateway(t *testing.T) {
	const doc = `
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {namespace: istio-system, name: eastwest, labels: {topology.istio.io/network: net2}}
spec:
  gatewayClassName: istio-east-west
  listeners: [{name: mesh, port: 15008, protocol: HBONE, tls: {mode: Terminate}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {namespace: istio-system, name: unlabelled}
spec:
  gatewayClassName: istio-east-west
  listeners: [{name: mesh, port: 15008, protocol: HBONE, tls: {mode: Terminate}}]
`
	var objs cluster.Objects
	if errs := cluster.Decode("gw.yaml", []byte(doc), &objs); len(errs) > 0 {
		t.Fatal(errs)
	}
	objs.Sort()
	got := map[string]finding{}
	for _, f := range analyzeObjects(&objs, "gw.yaml", nil, nil) {
		if f.Code == codeGatewayProxy {
			got[f.Object] = f
		}
	}
	if f := got["Gateway istio-system/eastwest"]; f.Level != levelInfo || !strings.Contains(f.Message, "east-west gateway of network net2") {
		t.Errorf("eastwest: %+v", f)
	}
	if f := got["Gateway istio-system/unlabelled"]; f.Level != levelWarning || !strings.Contains(f.Message, "no label topology.istio.io/network") {
		t.Errorf("unlabelled: %+v", f)
	}
}
