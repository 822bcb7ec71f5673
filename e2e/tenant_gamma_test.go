package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

// Issue 24's Gateway API and waypoint isolation, attacked from a tenant's
// namespace (gevil) against a victim's (gshop), with namespace-scoped
// objects only: HTTPRoute, ReferenceGrant, Service labels. The mesh's
// shared waypoint demo/waypoint (examples/40-waypoint.yaml) lets every
// namespace use it, as a platform team's shared waypoint would.

// gammaMesh starts a mesh with the examples, namespaces gshop and gevil,
// and the shared waypoint.
func gammaMesh(t *testing.T) (*meshlab.Mesh, *meshlab.Waypoint, context.Context) {
	t.Helper()
	roottest.Require(t)
	m, err := meshlab.Start(t, meshlab.Options{Examples: []string{"../examples"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 3*time.Minute)
	for _, ns := range []string{"gshop", "gevil"} {
		if err := m.AddNamespace(ns, ambientNS); err != nil {
			t.Fatal(err)
		}
	}
	wp, err := m.StartWaypoint(ctx, "demo", "waypoint")
	if err != nil {
		t.Fatal(err)
	}
	return m, wp, ctx
}

// gammaApp adds a pod answering its name (and counting requests) and,
// when svcLabels is not nil, a Service of the same name on port 80.
func gammaApp(t *testing.T, ctx context.Context, m *meshlab.Mesh, node int, ns, name string, svcLabels map[string]string, hits *atomic.Int64) *testcluster.Pod {
	t.Helper()
	p, err := m.AddPod(ctx, node, testcluster.PodSpec{Name: name, Namespace: ns, ServiceAccount: name, Labels: map[string]string{"app": name}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ServeHTTP(p, 8080, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits != nil {
			hits.Add(1)
		}
		io.WriteString(w, name)
	})); err != nil {
		t.Fatal(err)
	}
	if svcLabels != nil {
		if _, err := m.AddService(testcluster.ServiceSpec{Name: name, Namespace: ns, Selector: map[string]string{"app": name},
			Labels: svcLabels, Ports: []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}}); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func gammaClient(t *testing.T, ctx context.Context, m *meshlab.Mesh, ns, name string) *testcluster.Pod {
	t.Helper()
	p, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: name, Namespace: ns, ServiceAccount: name, Labels: map[string]string{"app": name}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// gammaGet sends GET / from client to the Service ns/svc (its VIP, port
// 80) and returns the status and body (0 on a transport error).
func gammaGet(m *meshlab.Mesh, client *testcluster.Pod, ns, svc string) (int, string) {
	vip := m.Service(ns, svc)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return client.Dial(ctx, "tcp", netip.AddrPortFrom(vip, 80).String())
		}}}
	resp, err := hc.Get("http://" + svc + "." + ns + ".svc.cluster.local/")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// gammaWait polls until GET from client to ns/svc answers code and body.
func gammaWait(t *testing.T, m *meshlab.Mesh, client *testcluster.Pod, ns, svc string, code int, body string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, b := gammaGet(m, client, ns, svc)
		if c == code && (body == "" || b == body) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s/%s from %s/%s = %d %q, want %d %q", ns, svc, client.Namespace, client.Name, c, b, code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cpDumpWait polls the control plane's /config_dump until it contains s.
func cpDumpWait(t *testing.T, ctx context.Context, m *meshlab.Mesh, s string) {
	t.Helper()
	var last []byte
	for ctx.Err() == nil {
		code, body, err := m.NodeHTTP(ctx, 0, "http://"+meshlab.CPAdminAddr+"/config_dump")
		if err == nil && code == http.StatusOK && strings.Contains(string(body), s) {
			return
		}
		last = body
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("control plane config dump never contained %q; last:\n%s", s, last)
}

var useDemoWaypoint = map[string]string{"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "demo"}

// TestTenantConsumerRoute: an HTTPRoute in the attacker's namespace whose
// parentRef is the victim's Service is a consumer route: it sends the
// attacker's own clients to the attacker's sink, while the victim's
// clients keep reaching the victim's Service (and the sink never hears
// from them). Before this change the route applied to every client: on
// main the victim's requests are answered "sink".
func TestTenantConsumerRoute(t *testing.T) {
	m, _, ctx := gammaMesh(t)
	var sinkHits atomic.Int64
	cart := gammaApp(t, ctx, m, 1, "gshop", "cart", useDemoWaypoint, nil)
	sink := gammaApp(t, ctx, m, 1, "gevil", "sink", map[string]string{}, &sinkHits)
	victim := gammaClient(t, ctx, m, "gshop", "shopper")
	attacker := gammaClient(t, ctx, m, "gevil", "mallory")
	if err := m.SyncKubeProxy(); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, cart.IP, sink.IP, victim.IP, attacker.IP); err != nil {
		t.Fatal(err)
	}
	gammaWait(t, m, victim, "gshop", "cart", http.StatusOK, "cart")
	gammaWait(t, m, attacker, "gshop", "cart", http.StatusOK, "cart")

	apply(t, m, "e2e-tenant-consumer-route", `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: hijack, namespace: gevil}
spec:
  parentRefs: [{group: "", kind: Service, name: cart, namespace: gshop}]
  rules: [{backendRefs: [{name: sink, port: 80}]}]
`)
	// The route is in force at the waypoint: the attacker's own client
	// follows it.
	gammaWait(t, m, attacker, "gshop", "cart", http.StatusOK, "sink")
	before := sinkHits.Load()
	for i := range 20 {
		if code, body := gammaGet(m, victim, "gshop", "cart"); code != http.StatusOK || body != "cart" {
			t.Fatalf("victim request %d to gshop/cart = %d %q, want 200 \"cart\": the attacker's route applied to the victim's client", i, code, body)
		}
	}
	if n := sinkHits.Load() - before; n != 0 {
		t.Fatalf("the attacker's sink got %d of the victim's requests", n)
	}
}

// TestTenantReferenceGrant: the attacker's route on its own Service points
// a backendRef at the victim's payments Service. Without a ReferenceGrant
// in gshop the reference is refused: the request answers 500 and payments
// never sees it; once the victim grants it, the route reaches payments.
// On main the reference was followed without a grant (200 "payments").
func TestTenantReferenceGrant(t *testing.T) {
	m, _, ctx := gammaMesh(t)
	var payHits atomic.Int64
	pay := gammaApp(t, ctx, m, 1, "gshop", "payments", map[string]string{}, &payHits)
	front := gammaApp(t, ctx, m, 1, "gevil", "front", useDemoWaypoint, nil)
	attacker := gammaClient(t, ctx, m, "gevil", "mallory")
	if err := m.SyncKubeProxy(); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, pay.IP, front.IP, attacker.IP); err != nil {
		t.Fatal(err)
	}
	gammaWait(t, m, attacker, "gevil", "front", http.StatusOK, "front")

	apply(t, m, "e2e-tenant-refgrant-route", `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: steal, namespace: gevil}
spec:
  parentRefs: [{group: "", kind: Service, name: front}]
  rules: [{backendRefs: [{name: payments, namespace: gshop, port: 80}]}]
`)
	gammaWait(t, m, attacker, "gevil", "front", http.StatusInternalServerError, "")
	for i := range 10 {
		if code, body := gammaGet(m, attacker, "gevil", "front"); code != http.StatusInternalServerError {
			t.Fatalf("request %d without a ReferenceGrant = %d %q, want 500", i, code, body)
		}
	}
	if n := payHits.Load(); n != 0 {
		t.Fatalf("payments got %d requests through a reference nobody granted", n)
	}

	apply(t, m, "e2e-tenant-refgrant-grant", `
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: allow-gevil, namespace: gshop}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: gevil}]
  to: [{group: "", kind: Service, name: payments}]
`)
	gammaWait(t, m, attacker, "gevil", "front", http.StatusOK, "payments")
}

// TestTenantCrossNamespaceWaypoint: the victim runs a waypoint whose HBONE
// listener says nothing about other namespaces (Same). The attacker labels
// its Service to use it (istio.io/use-waypoint-namespace: gshop): the
// binding is refused with a reason in the control plane's dump, the
// attacker's traffic goes straight to its pod and never through the
// victim's waypoint. When the victim's listener allows every namespace,
// the same label binds and the traffic goes through it. On main the
// binding was accepted at once (no refusal, the waypoint logs the
// attacker's requests).
func TestTenantCrossNamespaceWaypoint(t *testing.T) {
	m, _, ctx := gammaMesh(t)
	// The victim's own waypoint: pod and Service as Istio deploys them,
	// then the Gateway (with the address a gateway controller would set).
	dir := t.TempDir()
	wpYAML := `
apiVersion: v1
kind: Pod
metadata:
  name: waypoint
  namespace: gshop
  labels: {gateway.networking.k8s.io/gateway-name: waypoint, istio.io/dataplane-mode: none}
spec:
  nodeName: node0
  serviceAccountName: waypoint
  containers: [{name: istio-proxy, image: istio/proxyv2}]
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: gshop}
spec:
  selector: {gateway.networking.k8s.io/gateway-name: waypoint}
  ports: [{name: mesh, port: 15008, targetPort: 15008}]
`
	if err := os.WriteFile(filepath.Join(dir, "gshop-waypoint.yaml"), []byte(wpYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.LoadYAML(ctx, filepath.Join(dir, "gshop-waypoint.yaml")); err != nil {
		t.Fatal(err)
	}
	gateway := func(allowed string) string {
		return fmt.Sprintf(`
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: gshop}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE%s}]
status:
  addresses: [{type: IPAddress, value: %s}]
`, allowed, m.Service("gshop", "waypoint"))
	}
	apply(t, m, "e2e-tenant-gshop-gateway", gateway(""))
	victimWP, err := m.StartWaypoint(ctx, "gshop", "waypoint")
	if err != nil {
		t.Fatal(err)
	}
	grab := gammaApp(t, ctx, m, 1, "gevil", "grab",
		map[string]string{"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "gshop"}, nil)
	attacker := gammaClient(t, ctx, m, "gevil", "mallory")
	if err := m.SyncKubeProxy(); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, grab.IP, attacker.IP); err != nil {
		t.Fatal(err)
	}
	throughVictim := func() bool {
		for _, a := range victimWP.AccessLogs() {
			if a.Str("dst.workload") == "grab" || strings.Contains(a.Str("dst.service"), "grab.gevil") {
				return true
			}
		}
		return false
	}

	cpDumpWait(t, ctx, m, "waypoint gshop/waypoint refuses Service gevil/grab")
	gammaWait(t, m, attacker, "gevil", "grab", http.StatusOK, "grab")
	for i := range 10 {
		if code, body := gammaGet(m, attacker, "gevil", "grab"); code != http.StatusOK || body != "grab" {
			t.Fatalf("request %d = %d %q, want 200 \"grab\" (direct)", i, code, body)
		}
	}
	if throughVictim() {
		t.Fatal("the attacker's traffic went through the victim's waypoint without the victim's permission")
	}

	// The victim allows every namespace: the same label now binds.
	apply(t, m, "e2e-tenant-gshop-gateway", gateway(", allowedRoutes: {namespaces: {from: All}}"))
	deadline := time.Now().Add(30 * time.Second)
	for !throughVictim() {
		if time.Now().After(deadline) {
			t.Fatal("with allowedRoutes from All the attacker's Service never used the waypoint")
		}
		gammaGet(m, attacker, "gevil", "grab")
		time.Sleep(100 * time.Millisecond)
	}
}
