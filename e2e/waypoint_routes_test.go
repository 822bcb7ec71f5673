package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// pathLog records the paths one HTTP app was asked for.
type pathLog struct {
	mu    sync.Mutex
	paths map[string]int
}

func (p *pathLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.paths[r.URL.Path]++
	p.mu.Unlock()
	io.WriteString(w, "ok")
}

func (p *pathLog) saw(path string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paths[path] > 0
}

// testWaypointRetryMirrorGRPC adds TestWaypointL7's route subtests: a retry
// on 503, a mirror to two destinations, and gRPC, each through the real
// waypoint and node proxies. Services here use demo/waypoint as web does.
func testWaypointRetryMirrorGRPC(t *testing.T, m *meshlab.Mesh, wp *meshlab.Waypoint, client *testcluster.Pod) {
	ctx := ctxT(t, 60*time.Second)
	useWaypoint := map[string]string{"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "demo"}
	var flakyHits atomic.Int64
	mirrors := map[string]*pathLog{"m1": {paths: map[string]int{}}, "m2": {paths: map[string]int{}}}
	grpcSrv := grpc.NewServer()
	healthpb.RegisterHealthServer(grpcSrv, health.NewServer()) // answers SERVING for ""
	for _, p := range []struct {
		name string
		node int
		h    http.Handler
	}{
		// flaky answers every odd request 503.
		{"flaky", 1, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if flakyHits.Add(1)%2 == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			fmt.Fprintf(w, "flaky %s", r.URL.Path)
		})},
		{"m1", 1, mirrors["m1"]},
		{"m2", 0, mirrors["m2"]},
		{"grpc", 1, grpcSrv},
	} {
		pod, err := m.AddPod(ctx, p.node, testcluster.PodSpec{Name: p.name, Namespace: "l7", ServiceAccount: p.name,
			Labels: map[string]string{"app": p.name}})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.ServeHTTP(pod, 8080, p.h); err != nil {
			t.Fatal(err)
		}
		if err := m.WaitForWorkloads(ctx, pod.IP); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(grpcSrv.Stop)
	for _, s := range []testcluster.ServiceSpec{
		{Name: "flaky", Namespace: "l7", Selector: map[string]string{"app": "flaky"}, Labels: useWaypoint,
			Ports: []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}},
		{Name: "mirrored", Namespace: "l7", Selector: map[string]string{"app": "m1"}, Labels: useWaypoint,
			Ports: []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}},
		{Name: "m1", Namespace: "l7", Selector: map[string]string{"app": "m1"}, Ports: []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}},
		{Name: "m2", Namespace: "l7", Selector: map[string]string{"app": "m2"}, Ports: []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}},
		{Name: "greeter", Namespace: "l7", Selector: map[string]string{"app": "grpc"}, Labels: useWaypoint,
			Ports: []kube.ServicePort{{Name: "grpc", Port: 9090, TargetPort: 8080}}},
	} {
		if _, err := m.AddService(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.SyncKubeProxy(); err != nil {
		t.Fatal(err)
	}
	apply(t, m, "e2e-wp-retry-mirror", `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: flaky-retry, namespace: l7}
spec:
  parentRefs: [{group: "", kind: Service, name: flaky, port: 80}]
  rules:
  - backendRefs: [{name: flaky, port: 80}]
    retry: {attempts: 2, codes: [503]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mirror-two, namespace: l7}
spec:
  parentRefs: [{group: "", kind: Service, name: mirrored, port: 80}]
  rules:
  - backendRefs: [{name: m1, port: 80}]
    filters:
    - {type: RequestMirror, requestMirror: {backendRef: {name: m1, port: 80}}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: m2, port: 80}}}
`)
	httpTo := func(svc string, port uint16) *http.Client {
		vip := m.Service("l7", svc)
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return client.Dial(ctx, "tcp", netip.AddrPortFrom(vip, port).String())
			}}}
	}
	status := func(c *http.Client, url string) int {
		resp, err := c.Get(url)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	t.Run("a retry on 503", func(t *testing.T) {
		c := httpTo("flaky", 80)
		// Without the route every other request fails; ten 200s in a row
		// (1 in 1024 by chance) say the retry arrived.
		deadline := time.Now().Add(30 * time.Second)
		for ok := 0; ok < 10; {
			if status(c, "http://flaky.l7.svc.cluster.local/probe") == http.StatusOK {
				ok++
			} else {
				ok = 0
			}
			if time.Now().After(deadline) {
				t.Fatal("flaky still fails without a retry: the HTTPRoute's retry did not reach the waypoint")
			}
		}
		before := flakyHits.Load()
		const n = 20
		for i := range n {
			if code := status(c, fmt.Sprintf("http://flaky.l7.svc.cluster.local/r%d", i)); code != http.StatusOK {
				t.Fatalf("request %d through the retry = %d, want 200", i, code)
			}
		}
		// Alternating 503/200: about half the requests needed a second try.
		if hits := flakyHits.Load() - before; hits < n+5 {
			t.Errorf("the backend saw %d attempts for %d requests; want retries", hits, n)
		}
		if _, err := wp.WaitAccessLog(ctx, func(a meshlab.AccessLog) bool {
			return a.Str("route") == "l7/flaky-retry" && a.Str("code") == "200"
		}); err != nil {
			t.Error(err)
		}
	})

	t.Run("a mirror to two destinations", func(t *testing.T) {
		c := httpTo("mirrored", 80)
		testkit.Eventually(t, 30*time.Second, "a mirrored request at m2: the route at the waypoint", func() bool {
			status(c, "http://mirrored.l7.svc.cluster.local/probe")
			return mirrors["m2"].saw("/probe")
		})
		if code := status(c, "http://mirrored.l7.svc.cluster.local/once"); code != http.StatusOK {
			t.Fatalf("GET /once = %d", code)
		}
		// m1 is both the backend and a mirror: it sees /once twice.
		testkit.Eventually(t, 10*time.Second, "both mirrors to see /once", func() bool {
			mirrors["m1"].mu.Lock()
			n1 := mirrors["m1"].paths["/once"]
			mirrors["m1"].mu.Unlock()
			return n1 == 2 && mirrors["m2"].saw("/once")
		})
	})

	t.Run("gRPC through the waypoint", func(t *testing.T) {
		vip := m.Service("l7", "greeter")
		conn, err := grpc.NewClient("passthrough:///greeter.l7.svc.cluster.local:9090",
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				return client.Dial(ctx, "tcp", netip.AddrPortFrom(vip, 9090).String())
			}))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		hc := healthpb.NewHealthClient(conn)
		var lastErr error
		testkit.Eventually(t, 30*time.Second, "a gRPC health check through the waypoint", func() bool {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
			lastErr = err
			return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
		})
		if _, err := wp.WaitAccessLog(ctx, func(a meshlab.AccessLog) bool {
			return a.Str("protocol") == "grpc" && a.Str("path") == "/grpc.health.v1.Health/Check" && a.Str("code") == "200"
		}); err != nil {
			t.Errorf("%v (last call: %v)", err, lastErr)
		}
	})
}
