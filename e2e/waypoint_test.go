package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint"
)

// TestWaypointL7 runs the real cmd/waypoint for examples/' waypoint Gateway
// (demo/waypoint) in a two-node mesh, with the real node proxies capturing
// in the pods: an HTTP service "web" in namespace l7 (on node1) uses the
// waypoint; a client (node0) reaches it through client node proxy → waypoint
// → web's node proxy. Its subtests share the mesh and clean up their policies.
func TestWaypointL7(t *testing.T) {
	roottest.Require(t)
	m, err := meshlab.Start(t, meshlab.Options{Examples: []string{"../examples"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second) // the set-up; each subtest has its own bound
	if err := m.AddNamespace("l7", ambientNS); err != nil {
		t.Fatal(err)
	}
	web, err := m.AddPod(ctx, 1, testcluster.PodSpec{Name: "web", Namespace: "l7", ServiceAccount: "web", Labels: map[string]string{"app": "web"},
		// meshlab echoes on every declared container port (9000); 8080 is
		// the HTTP app below, reached by its numeric targetPort.
		Containers: []kube.Container{{Name: "app", Ports: []kube.ContainerPort{{Name: "tcp-echo", Port: 9000}}}}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: "curl", Namespace: "l7", ServiceAccount: "curl", Labels: map[string]string{"app": "curl"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddService(testcluster.ServiceSpec{Name: "web", Namespace: "l7", Selector: map[string]string{"app": "web"},
		Labels: map[string]string{"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "demo"},
		Ports:  []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}, {Name: "tcp-echo", Port: 9000, TargetPort: 9000}}}); err != nil {
		t.Fatal(err)
	}
	if err := m.ServeHTTP(web, 8080, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "web path=%s xff=%s", r.URL.Path, r.Header.Get("X-Forwarded-For"))
	})); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncKubeProxy(); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, web.IP, client.IP); err != nil {
		t.Fatal(err)
	}
	wp, err := m.StartWaypoint(ctx, "demo", "waypoint")
	if err != nil {
		t.Fatal(err)
	}
	vip := m.Service("l7", "web")
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return client.Dial(ctx, "tcp", netip.AddrPortFrom(vip, 80).String())
		}}}
	get := func(t *testing.T, path string) (int, string) {
		t.Helper()
		resp, err := hc.Get("http://web.l7.svc.cluster.local" + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// waitCode polls until path answers want (policies take a push to arrive).
	waitCode := func(t *testing.T, path string, want int) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, body := get(t, path)
			if code == want {
				return body
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s = %d %q, want %d", path, code, body, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitCode(t, "/", http.StatusOK)

	t.Run("DENY on a path: 403, other paths work", func(t *testing.T) {
		ctx := ctxT(t, 30*time.Second)
		apply(t, m, "e2e-wp-deny-admin", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: l7}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: DENY
  rules: [{to: [{operation: {paths: ["/admin*"]}}]}]
`)
		if body := waitCode(t, "/admin/users", http.StatusForbidden); body != waypoint.DeniedBody {
			t.Errorf("denied body %q, want %q", body, waypoint.DeniedBody)
		}
		if body := waitCode(t, "/public", http.StatusOK); !strings.Contains(body, "path=/public") || !strings.Contains(body, "xff="+client.IP.String()) {
			t.Errorf("allowed answer %q: want path=/public and X-Forwarded-For %s", body, client.IP)
		}
		// The waypoint decided it, as the client (not the client's node proxy).
		if _, err := wp.WaitAccessLog(ctx, func(a meshlab.AccessLog) bool {
			return a.Str("path") == "/admin/users" && a.Str("code") == "403" && a.Str("authz.policy") == "l7/deny-admin" &&
				a.Str("src.identity") == spiffe("l7", "curl")
		}); err != nil {
			t.Error(err)
		}
		// The waypoint went on to the endpoint itself over HBONE (through
		// web's node proxy, which accepts it as the waypoint's identity).
		if _, err := wp.WaitAccessLog(ctx, func(a meshlab.AccessLog) bool {
			return a.Str("path") == "/public" && a.Str("code") == "200" &&
				a.Str("upstream") == "hbone "+netip.AddrPortFrom(web.IP, 8080).String()
		}); err != nil {
			t.Error(err)
		}
		metrics, err := wp.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`reporter="waypoint"`, `response_code="403"`, "istio_request_duration_milliseconds_bucket"} {
			if !strings.Contains(metrics, want) {
				t.Errorf("waypoint metrics lack %s", want)
			}
		}
	})

	t.Run("GatewayClass default deny plus a per-Gateway ALLOW", func(t *testing.T) {
		ctx := ctxT(t, 30*time.Second)
		apply(t, m, "e2e-wp-class-deny", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: waypoint-default-deny, namespace: istio-system}
spec:
  targetRefs: [{kind: GatewayClass, group: gateway.networking.k8s.io, name: istio-waypoint}]
`)
		if body := waitCode(t, "/public", http.StatusForbidden); body != waypoint.DeniedBody {
			t.Errorf("default deny body %q", body)
		}
		apply(t, m, "e2e-wp-gw-allow", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-curl-get, namespace: demo}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  rules:
  - from: [{source: {principals: ["cluster.local/ns/l7/sa/curl"]}}]
    to: [{operation: {methods: [GET], paths: ["/public*"]}}]
`)
		waitCode(t, "/public", http.StatusOK)
		if code, _ := get(t, "/private"); code != http.StatusForbidden {
			t.Errorf("GET /private under the class deny = %d, want 403", code)
		}
		if _, err := wp.WaitAccessLog(ctx, func(a meshlab.AccessLog) bool {
			return a.Str("path") == "/public" && a.Str("code") == "200" && a.Str("authz.policy") == "demo/allow-curl-get"
		}); err != nil {
			t.Error(err)
		}
	})

	t.Run("a non-HTTP port falls back to L4", func(t *testing.T) {
		ctx := ctxT(t, 30*time.Second)
		want := payload(4321)
		// Polled: the previous subtest's default deny may still be
		// leaving the waypoint.
		for {
			got, err := meshlab.RoundTrip(ctx, client, netip.AddrPortFrom(vip, 9000), want)
			if err == nil && bytes.Equal(got, want) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("TCP via the waypoint: got %d of %d bytes, err %v", len(got), len(want), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if _, err := wp.WaitAccessLog(ctx, func(a meshlab.AccessLog) bool {
			return a.Str("dst.addr") == netip.AddrPortFrom(vip, 9000).String() && a.Str("protocol") == "tcp" && a.Str("code") == "200"
		}); err != nil {
			t.Error(err)
		}
		// An L7-only DENY on the TCP port matches every connection there
		// (fail closed), as Istio's waypoint does.
		apply(t, m, "e2e-wp-deny-tcp", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-get-on-tcp, namespace: l7}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: DENY
  rules: [{to: [{operation: {ports: ["9000"], methods: [GET]}}]}]
`)
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, err := meshlab.RoundTrip(ctx, client, netip.AddrPortFrom(vip, 9000), want)
			if err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("TCP still passes under a DENY with HTTP fields on its port")
			}
			time.Sleep(100 * time.Millisecond)
		}
		if code, _ := get(t, "/"); code != http.StatusOK {
			t.Errorf("HTTP port under the TCP-port DENY = %d, want 200", code)
		}
	})

	t.Run("HTTPRoute from the YAML directory splits 90/10 and routes by path", func(t *testing.T) {
		ctx := ctxT(t, 60*time.Second)
		web2, err := m.AddPod(ctx, 1, testcluster.PodSpec{Name: "web2", Namespace: "l7", ServiceAccount: "web", Labels: map[string]string{"app": "web2"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.ServeHTTP(web2, 8080, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "web2 path=%s", r.URL.Path)
		})); err != nil {
			t.Fatal(err)
		}
		for _, s := range []testcluster.ServiceSpec{
			{Name: "web-v1", Namespace: "l7", Selector: map[string]string{"app": "web"}, Ports: []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}},
			{Name: "web-v2", Namespace: "l7", Selector: map[string]string{"app": "web2"}, Ports: []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}},
		} {
			if _, err := m.AddService(s); err != nil {
				t.Fatal(err)
			}
		}
		if err := m.SyncKubeProxy(); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitForWorkloads(ctx, web2.IP); err != nil {
			t.Fatal(err)
		}
		apply(t, m, "e2e-wp-route", `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web-split, namespace: l7}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /v2}}]
    backendRefs: [{name: web-v2, port: 80}]
  - backendRefs:
    - {name: web-v1, port: 80, weight: 90}
    - {name: web-v2, port: 80, weight: 10}
`)
		// The route arrives with a push: /v2 answers from web2 then.
		deadline := time.Now().Add(20 * time.Second)
		for {
			if code, body := get(t, "/v2/x"); code == http.StatusOK && strings.HasPrefix(body, "web2 ") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("/v2/x never answered from web-v2: the HTTPRoute did not reach the waypoint")
			}
			time.Sleep(100 * time.Millisecond)
		}
		const n = 1000
		v2 := 0
		for range n {
			code, body := get(t, "/split")
			switch {
			case code != http.StatusOK:
				t.Fatalf("GET /split = %d %q", code, body)
			case strings.HasPrefix(body, "web2 "):
				v2++
			case !strings.HasPrefix(body, "web path=/split"):
				t.Fatalf("GET /split answered %q", body)
			}
		}
		// Issue 14: within ±3 % of 10 % over 1,000 requests. Binomial(1000,
		// 0.1) has sd 9.5, so 70..130 is about ±3.2 sd.
		if v2 < 70 || v2 > 130 {
			t.Errorf("web-v2 answered %d of %d requests, want 10 %% ± 3 %%", v2, n)
		}
		t.Logf("web-v2 answered %d of %d (weight 10 of 100)", v2, n)
		if _, err := wp.WaitAccessLog(ctx, func(a meshlab.AccessLog) bool {
			return a.Str("path") == "/split" && a.Str("code") == "200" && a.Str("route") == "l7/web-split"
		}); err != nil {
			t.Error(err)
		}
	})
	testWaypointRetryMirrorGRPC(t, m, wp, client)
}

func apply(t *testing.T, m *meshlab.Mesh, name, yaml string) {
	t.Helper()
	if err := m.Apply(name, []byte(yaml)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Remove(name) })
}
