package translate

import (
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// TestIstiodAppProtocolAndTargetPort: the workload API ports as istiod
// writes them (toAppProtocolFromProtocol): tcp is TCP, https and tls are
// TLS, both from a port name prefix, an appProtocol or a ServiceEntry
// protocol; a ServiceEntry port without targetPort targets its number.
func TestIstiodAppProtocolAndTargetPort(t *testing.T) {
	const y = `
apiVersion: v1
kind: Service
metadata: {name: s, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: tcp-db, port: 5432}
  - {name: https, port: 443}
  - {name: x, port: 8443, appProtocol: tls}
  - {name: web, port: 80, appProtocol: http}
  - {name: other, port: 81}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: demo}
spec:
  hosts: [ext.example.com]
  addresses: [240.0.0.1]
  resolution: STATIC
  endpoints: [{address: 10.9.0.1}]
  ports:
  - {name: https, number: 443, protocol: HTTPS}
  - {name: tcp, number: 9000, protocol: TCP, targetPort: 9443}
`
	var objs cluster.Objects
	if errs := cluster.Decode("ports.yaml", []byte(y), &objs); len(errs) > 0 {
		t.Fatalf("decode: %v", errs)
	}
	objs.Sort()
	res := Translate(LocalDefaults(), &objs, nil)
	type port struct {
		proto  workloadapi.AppProtocol
		target uint32
	}
	got := map[string]map[uint32]port{}
	for _, a := range res.Addresses.All() {
		if s := a.GetService(); s != nil {
			got[s.GetName()] = map[uint32]port{}
			for _, p := range s.GetPorts() {
				got[s.GetName()][p.GetServicePort()] = port{p.GetAppProtocol(), p.GetTargetPort()}
			}
		}
	}
	want := map[string]map[uint32]workloadapi.AppProtocol{
		"s":   {5432: workloadapi.AppProtocol_TCP, 443: workloadapi.AppProtocol_TLS, 8443: workloadapi.AppProtocol_TLS, 80: workloadapi.AppProtocol_HTTP11, 81: workloadapi.AppProtocol_UNKNOWN},
		"ext": {443: workloadapi.AppProtocol_TLS, 9000: workloadapi.AppProtocol_TCP},
	}
	for svc, ports := range want {
		for n, p := range ports {
			if g, ok := got[svc][n]; !ok || g.proto != p {
				t.Errorf("%s port %d: app protocol %v, want %v (all: %v)", svc, n, g.proto, p, got)
			}
		}
	}
	if g := got["ext"]; g[443].target != 443 || g[9000].target != 9443 {
		t.Errorf("ServiceEntry target ports %+v, want 443→443 (default) and 9000→9443", g)
	}
}
