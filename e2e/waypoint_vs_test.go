package e2e

import (
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
)

// TestWaypointVirtualService runs Istio's own routing objects through the
// real cmd/waypoint (examples/' demo/waypoint) and the real node proxies: a
// service "reviews" in namespace vs with three pods (version v1, v2 and a
// v3 that answers 500) uses the waypoint; a VirtualService splits it 90/10
// between DestinationRule subsets v1 and v2, a rule naming an undefined
// subset answers 503, and a subset over all three pods with
// outlierDetection ejects v3 after its consecutive 5xx.
func TestWaypointVirtualService(t *testing.T) {
	roottest.Require(t)
	m, err := meshlab.Start(t, meshlab.Options{Examples: []string{"../examples"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 90*time.Second)
	if err := m.AddNamespace("vs", ambientNS); err != nil {
		t.Fatal(err)
	}
	var ips []netip.Addr
	for i, v := range []string{"v1", "v2", "v3"} {
		pod, err := m.AddPod(ctx, i%2, testcluster.PodSpec{Name: "reviews-" + v, Namespace: "vs", ServiceAccount: "reviews",
			Labels: map[string]string{"app": "reviews", "version": v}})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.ServeHTTP(pod, 8080, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if v == "v3" {
				http.Error(w, "reviews-v3 is broken", http.StatusInternalServerError)
				return
			}
			fmt.Fprintf(w, "reviews-%s path=%s", v, r.URL.Path)
		})); err != nil {
			t.Fatal(err)
		}
		ips = append(ips, pod.IP)
	}
	client, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: "curl", Namespace: "vs", ServiceAccount: "curl", Labels: map[string]string{"app": "curl"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddService(testcluster.ServiceSpec{Name: "reviews", Namespace: "vs", Selector: map[string]string{"app": "reviews"},
		Labels: map[string]string{"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "demo"},
		Ports:  []kube.ServicePort{{Name: "http", Port: 9080, TargetPort: 8080}}}); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncKubeProxy(); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, append(ips, client.IP)...); err != nil {
		t.Fatal(err)
	}
	wp, err := m.StartWaypoint(ctx, "demo", "waypoint")
	if err != nil {
		t.Fatal(err)
	}
	vip := m.Service("vs", "reviews")
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return client.Dial(ctx, "tcp", netip.AddrPortFrom(vip, 9080).String())
		}}}
	get := func(t *testing.T, path string) (int, string) {
		t.Helper()
		resp, err := hc.Get("http://reviews.vs.svc.cluster.local:9080" + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	apply(t, m, "e2e-wp-vs", `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: vs}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
  - name: any
    labels: {app: reviews}
    trafficPolicy:
      loadBalancer: {simple: ROUND_ROBIN}
      outlierDetection: {consecutive5xxErrors: 2, interval: 1s, baseEjectionTime: 60s, maxEjectionPercent: 50}
---
apiVersion: networking.istio.io/v1beta1
kind: VirtualService
metadata: {name: reviews, namespace: vs}
spec:
  hosts: [reviews]
  http:
  - match: [{uri: {prefix: /missing}}]
    route: [{destination: {host: reviews, subset: v9}}]
  - match: [{uri: {prefix: /outlier}}]
    route: [{destination: {host: reviews, subset: any}}]
  - route:
    - {destination: {host: reviews, subset: v1}, weight: 90}
    - {destination: {host: reviews, subset: v2}, weight: 10}
`)
	// The objects arrive with a push: /missing answers 503 then.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, _ := get(t, "/missing"); code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/missing never answered 503: the VirtualService did not reach the waypoint")
		}
		time.Sleep(100 * time.Millisecond)
	}

	t.Run("subsets split 90/10", func(t *testing.T) {
		const n = 1000
		v2 := 0
		for range n {
			code, body := get(t, "/split")
			switch {
			case code != http.StatusOK:
				t.Fatalf("GET /split = %d %q", code, body)
			case strings.HasPrefix(body, "reviews-v2 "):
				v2++
			case !strings.HasPrefix(body, "reviews-v1 "):
				t.Fatalf("GET /split answered %q (subset v3 must never be picked)", body)
			}
		}
		// Binomial(1000, 0.1): sd 9.5, so 70..130 is about ±3.2 sd.
		if v2 < 70 || v2 > 130 {
			t.Errorf("subset v2 answered %d of %d requests, want 10 %% ± 3 %%", v2, n)
		}
		t.Logf("subset v2 answered %d of %d (weight 10 of 100)", v2, n)
		if _, err := wp.WaitAccessLog(ctxT(t, 10*time.Second), func(a meshlab.AccessLog) bool {
			return a.Str("path") == "/split" && a.Str("code") == "200" && a.Str("route") == "vs/reviews"
		}); err != nil {
			t.Error(err)
		}
	})

	t.Run("undefined subset answers 503", func(t *testing.T) {
		if code, _ := get(t, "/missing/x"); code != http.StatusServiceUnavailable {
			t.Errorf("GET /missing/x = %d, want 503", code)
		}
	})

	t.Run("outlier detection ejects the endpoint that answers 5xx", func(t *testing.T) {
		// Round robin over three endpoints: v3 fails on every third request
		// until its second consecutive 5xx ejects it (for 60 s).
		fails := 0
		for range 12 {
			code, body := get(t, "/outlier")
			switch {
			case code == http.StatusInternalServerError:
				fails++
			case code != http.StatusOK:
				t.Fatalf("GET /outlier = %d %q", code, body)
			}
		}
		if fails != 2 {
			t.Errorf("%d answers 500 before the ejection, want 2 (consecutive5xxErrors)", fails)
		}
		seen := map[string]bool{}
		for range 30 {
			code, body := get(t, "/outlier")
			if code != http.StatusOK {
				t.Fatalf("GET /outlier after the ejection = %d %q", code, body)
			}
			seen[strings.Fields(body)[0]] = true
		}
		if !seen["reviews-v1"] || !seen["reviews-v2"] {
			t.Errorf("after v3's ejection answers came from %v, want v1 and v2", seen)
		}
	})
}
