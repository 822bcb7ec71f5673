package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
)

// TestWaypointVirtualService runs Istio's own routing objects through the
// real cmd/waypoint (examples/' demo/waypoint) and the real node proxies: a
// service "reviews" in namespace vs with three pods (version v1, v2 and a
// v3 that answers 500) uses the waypoint; a VirtualService splits it 90/10
// between DestinationRule subsets v1 and v2, a rule naming an undefined
// subset answers 503, and a subset over all three pods with
// outlierDetection ejects v3 after its consecutive 5xx.
func TestWaypointVirtualService(t *testing.T) {
	ctx := ctxT(t, 90*time.Second)
	var servers []waypointServer
	for i, v := range []string{"v1", "v2", "v3"} {
		servers = append(servers, waypointServer{Name: "reviews-" + v, Node: i % 2, Labels: map[string]string{"version": v},
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if v == "v3" {
					http.Error(w, "reviews-v3 is broken", http.StatusInternalServerError)
					return
				}
				fmt.Fprintf(w, "reviews-%s path=%s", v, r.URL.Path)
			})})
	}
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "vs", Service: "reviews", Port: 9080, Servers: servers})
	m, wp, get := w.Mesh, w.WP, w.get
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
	w.waitCode(t, "/missing", nil, http.StatusServiceUnavailable)

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
