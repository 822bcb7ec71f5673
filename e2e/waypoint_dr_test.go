package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// DestinationRule traffic policy through the real cmd/waypoint and node
// proxies: connectionPool circuit breaking, consistent hashing and
// locality failover.

// waitDR polls until the waypoint routes requests by the DestinationRule's
// own catch-all route (its policy arrived).
func (w *waypointMesh) waitDR(t *testing.T, route string, header http.Header) {
	t.Helper()
	n := 0
	testkit.EventuallyErr(t, waitTimeout, "the DestinationRule "+route+" at the waypoint", func() error {
		n++
		path := "/dr-probe-" + strconv.Itoa(n)
		if _, _, err := w.tryDo(path, header); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := w.WP.WaitAccessLog(ctx, func(a meshlab.AccessLog) bool { return a.Str("path") == path && a.Str("route") == route })
		return err
	})
}

// TestWaypointConnectionPool: with http2MaxRequests 2, two requests held
// at the backend fill the destination's circuit breaker, the third answers
// 503 with Envoy's overflow body and the response flag UO (access log),
// and once they end requests pass again.
func TestWaypointConnectionPool(t *testing.T) {
	ctx := ctxT(t, 180*time.Second)
	release := make(chan struct{})
	var held atomic.Int32
	handler := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			held.Add(1)
			<-release
		}
		fmt.Fprint(rw, "ok")
	})
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "cpool", Service: "echo", Handler: handler})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	apply(t, w.Mesh, "e2e-wp-cpool", `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: pool, namespace: cpool}
spec:
  host: echo
  trafficPolicy:
    connectionPool: {http: {http2MaxRequests: 2}}
`)
	w.waitDR(t, "cpool/pool", nil)

	hc := *w.hc
	hc.Timeout = 60 * time.Second
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := hc.Get(w.URL + "/hold")
			if err != nil {
				t.Errorf("held request: %v", err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	testkit.EventuallyErr(t, waitTimeout, "two requests held at the backend", func() error {
		if n := held.Load(); n != 2 {
			return fmt.Errorf("%d held", n)
		}
		return nil
	})
	code, body := w.get(t, "/third")
	if code != http.StatusServiceUnavailable || body != "upstream connect error or disconnect/reset before headers. reset reason: overflow" {
		t.Errorf("third request = %d %q, want 503 with Envoy's overflow body", code, body)
	}
	if _, err := w.WP.WaitAccessLog(ctxT(t, 10*time.Second), func(a meshlab.AccessLog) bool {
		return a.Str("path") == "/third" && a.Int("code") == 503 && a.Str("flags") == "UO"
	}); err != nil {
		t.Errorf("no access log line with flags UO: %v", err)
	}
	once.Do(func() { close(release) })
	wg.Wait()
	if codes[0] != 200 || codes[1] != 200 {
		t.Errorf("held requests answered %v, want 200s", codes)
	}
	if code, _ := w.get(t, "/after"); code != 200 {
		t.Errorf("after the held requests ended: %d, want 200", code)
	}
}

// TestWaypointConsistentHash: with consistentHash on a header, one header
// value reaches one endpoint across 1,000 requests, and different values
// spread over the endpoints.
func TestWaypointConsistentHash(t *testing.T) {
	ctx := ctxT(t, 180*time.Second)
	named := func(name string) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { fmt.Fprint(rw, name) })
	}
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "chash", Service: "echo", Servers: []waypointServer{
		{Name: "echo-a", Node: 1, Handler: named("a")}, {Name: "echo-b", Node: 1, Handler: named("b")},
		{Name: "echo-c", Node: 0, Handler: named("c")},
	}})
	apply(t, w.Mesh, "e2e-wp-chash", `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: sticky, namespace: chash}
spec:
  host: echo
  trafficPolicy:
    loadBalancer: {consistentHash: {httpHeaderName: x-user, ringHash: {minimumRingSize: 1024}}}
`)
	w.waitDR(t, "chash/sticky", nil)
	// Keep-alive: 1,000 requests on a few connections.
	hc := *w.hc
	tr := w.hc.Transport.(*http.Transport).Clone()
	tr.DisableKeepAlives = false
	hc.Transport = tr
	get := func(user string) string {
		req, _ := http.NewRequest(http.MethodGet, w.URL+"/", nil)
		req.Header.Set("X-User", user)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET as %s: %v", user, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET as %s = %d %q", user, resp.StatusCode, b)
		}
		return string(b)
	}
	first := get("alice")
	for i := range 1000 {
		if got := get("alice"); got != first {
			t.Fatalf("request %d for alice reached %s, the first reached %s", i, got, first)
		}
	}
	seen := map[string]bool{}
	for i := range 60 {
		seen[get("user-"+strconv.Itoa(i))] = true
	}
	if len(seen) != 3 {
		t.Errorf("60 users reached %v, want all three endpoints", seen)
	}
}

// TestWaypointLocalityFailover: the waypoint and the endpoint "local" are
// in region r1 zone z1 (their Nodes' labels); "far" is in r2 and "backup"
// in r3, which failover names for r1. Every request goes to local; when
// it fails (outlier detection ejects it) they go to backup, never far.
func TestWaypointLocalityFailover(t *testing.T) {
	ctx := ctxT(t, 180*time.Second)
	var localFails atomic.Bool
	named := func(name string) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if name == "local" && localFails.Load() {
				http.Error(rw, "down", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprint(rw, name)
		})
	}
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "loc", Service: "echo", Servers: []waypointServer{
		{Name: "local", Node: 1, Handler: named("local")},
		{Name: "far", Node: 1, Handler: named("far"), Labels: map[string]string{"istio-locality": "r2.z"}},
		{Name: "backup", Node: 0, Handler: named("backup"), Labels: map[string]string{"istio-locality": "r3.z"}},
	}})
	var nodes strings.Builder
	for _, n := range w.Nodes {
		fmt.Fprintf(&nodes, "---\napiVersion: v1\nkind: Node\nmetadata: {name: %s, labels: {topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: z1}}\n", n.Name)
	}
	apply(t, w.Mesh, "e2e-wp-loc-nodes", nodes.String())
	apply(t, w.Mesh, "e2e-wp-loc", `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: failover, namespace: loc}
spec:
  host: echo
  trafficPolicy:
    loadBalancer:
      localityLbSetting: {failover: [{from: r1, to: r3}]}
    outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 60s, maxEjectionPercent: 100}
`)
	w.waitDR(t, "loc/failover", nil)
	// The Nodes' localities reach the waypoint with the workloads: wait
	// until every request stays local.
	testkit.EventuallyErr(t, waitTimeout, "requests to stay in the waypoint's locality", func() error {
		for range 20 {
			code, body, err := w.tryDo("/", nil)
			if err != nil {
				return err
			}
			if code != 200 || body != "local" {
				return fmt.Errorf("a request reached %d %q", code, body)
			}
		}
		return nil
	})
	localFails.Store(true)
	// The first failure ejects local; from then on backup takes all.
	w.get(t, "/fail")
	for i := range 30 {
		if code, body := w.get(t, "/"); code != 200 || body != "backup" {
			t.Fatalf("request %d after local failed = %d %q, want backup (the failover region)", i, code, body)
		}
	}
}
