package cluster

import (
	"strings"
	"testing"
	"time"
)

// TestIstioGoDurations: Istio objects written with Go durations (as Istio's
// samples are: baseEjectionTime: 3m) decode in local mode as they do from
// the API server, in nested messages, lists and maps; a string that is no
// duration is still an error with its field.
func TestIstioGoDurations(t *testing.T) {
	doc := `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: httpbin}
spec:
  host: httpbin
  trafficPolicy:
    outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 3m}
  subsets: [{name: v1, labels: {version: v1}, trafficPolicy: {outlierDetection: {interval: 1m30s}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: httpbin}
spec:
  hosts: [httpbin]
  http: [{timeout: 500ms, retries: {attempts: 2, perTryTimeout: 0.25s}, route: [{destination: {host: httpbin}}]}]
`
	var o Objects
	if errs := Decode("d.yaml", []byte(doc), &o); len(errs) > 0 {
		t.Fatal(errs)
	}
	od := o.DestinationRules[0].Spec.GetTrafficPolicy().GetOutlierDetection()
	if od.GetBaseEjectionTime().AsDuration() != 3*time.Minute || od.GetInterval().AsDuration() != time.Second ||
		o.DestinationRules[0].Spec.GetSubsets()[0].GetTrafficPolicy().GetOutlierDetection().GetInterval().AsDuration() != 90*time.Second {
		t.Errorf("outlier detection %v", od)
	}
	h := o.VirtualServices[0].Spec.GetHttp()[0]
	if h.GetTimeout().AsDuration() != 500*time.Millisecond || h.GetRetries().GetPerTryTimeout().AsDuration() != 250*time.Millisecond {
		t.Errorf("http route %v", h)
	}
	bad := strings.Replace(doc, "baseEjectionTime: 3m", "baseEjectionTime: soon", 1)
	if errs := Decode("d.yaml", []byte(bad), &Objects{}); len(errs) != 1 || !strings.Contains(errs[0].Error(), "Duration") {
		t.Errorf("a non-duration decoded: %v", errs)
	}
}
