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

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// versionServers are reviews-v1 and reviews-v2, each answering
// "reviews-<v> path=<path>".
func versionServers() []waypointServer {
	var out []waypointServer
	for i, v := range []string{"v1", "v2"} {
		out = append(out, waypointServer{Name: "reviews-" + v, Node: i % 2, Labels: map[string]string{"version": v},
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "reviews-%s path=%s", v, r.URL.Path)
			})})
	}
	return out
}

// getFrom sends a GET for path to the waypoint mesh's Service from pod.
func (w *waypointMesh) getFrom(t *testing.T, pod *testcluster.Pod, path string) (int, string) {
	t.Helper()
	code, body, err := w.tryGetFrom(pod, path)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

// tryGetFrom is getFrom for polling callers (see tryDo).
func (w *waypointMesh) tryGetFrom(pod *testcluster.Pod, path string) (int, string, error) {
	dst := netip.AddrPortFrom(w.VIP, uint16(w.Port)).String()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return pod.Dial(ctx, "tcp", dst) }}}
	resp, err := hc.Get(w.URL + path)
	if err != nil {
		return 0, "", fmt.Errorf("GET %s from %s: %w", path, pod.Name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestWaypointVirtualServiceDelegate: a root VirtualService in namespace
// vsd delegates /v2 to a VirtualService of namespace team (exported to
// vsd), through the real waypoint: the delegate's rules apply within the
// root's match (its /v2/api rule to v2, its catch-all to v1 with its own
// rewrite). Namespace evil writes hostless VirtualServices with the names
// the root uses: neither takes a request. The root also names a delegate
// that does not exist: its /gone answers 500 rather than falling through
// to the catch-all.
func TestWaypointVirtualServiceDelegate(t *testing.T) {
	ctx := ctxT(t, 180*time.Second) // the first test of a run also builds the binaries
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "vsd", Service: "reviews", Port: 9080, Servers: versionServers()})
	apply(t, w.Mesh, "e2e-wp-delegate", `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: vsd}
spec:
  host: reviews
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: vsd}
spec:
  hosts: [reviews]
  http:
  - match: [{uri: {prefix: /v2}}]
    delegate: {name: v2-routes, namespace: team}
  - match: [{uri: {prefix: /gone}}]
    delegate: {name: nothing-here}
  - route: [{destination: {host: reviews, subset: v1}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: v2-routes, namespace: team}
spec:
  exportTo: [vsd]
  http:
  - match: [{uri: {prefix: /v2/api}}]
    route: [{destination: {host: reviews.vsd.svc.cluster.local, subset: v2}}]
  - rewrite: {uri: /rewritten}
    route: [{destination: {host: reviews.vsd.svc.cluster.local, subset: v1}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: v2-routes, namespace: evil}
spec:
  http: [{directResponse: {status: 200, body: {string: hijacked}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: nothing-here, namespace: evil}
spec:
  http: [{directResponse: {status: 200, body: {string: hijacked}}}]
`)
	w.waitCode(t, "/gone", nil, http.StatusInternalServerError)
	for _, tc := range []struct {
		path, want string
		code       int
	}{
		{"/v2/api/books", "reviews-v2 path=/v2/api/books", 200},
		{"/v2/other", "reviews-v1 path=/rewritten/other", 200},
		{"/gone/x", "", 500},
		{"/other", "reviews-v1 path=/other", 200},
	} {
		for range 5 {
			code, body := w.get(t, tc.path)
			if code != tc.code || tc.want != "" && body != tc.want {
				t.Errorf("GET %s = %d %q, want %d %q", tc.path, code, body, tc.code, tc.want)
			}
			if strings.Contains(body, "hijacked") {
				t.Fatalf("GET %s reached evil's VirtualService", tc.path)
			}
		}
	}
}

// TestWaypointSourceLabels: VirtualService sourceLabels and sourceNamespace
// at the real waypoint match the client: the canary pod (track=canary)
// reaches v2, a pod of namespace team gets the team rule's answer, and
// the kit's own client (app=curl, no track) the catch-all v1.
func TestWaypointSourceLabels(t *testing.T) {
	ctx := ctxT(t, 180*time.Second) // the first test of a run also builds the binaries
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "vss", Service: "reviews", Port: 9080, Servers: versionServers()})
	canary, err := w.AddPod(ctx, 1, testcluster.PodSpec{Name: "canary", Namespace: "vss", ServiceAccount: "curl",
		Labels: map[string]string{"app": "curl", "track": "canary"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddNamespace("team", ambientNS); err != nil {
		t.Fatal(err)
	}
	teamPod, err := w.AddPod(ctx, 0, testcluster.PodSpec{Name: "client", Namespace: "team", ServiceAccount: "client",
		Labels: map[string]string{"app": "client", "track": "stable"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitForWorkloads(ctx, canary.IP, teamPod.IP); err != nil {
		t.Fatal(err)
	}
	apply(t, w.Mesh, "e2e-wp-source", `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: vss}
spec:
  host: reviews
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: vss}
spec:
  hosts: [reviews]
  http:
  - match: [{sourceLabels: {track: canary}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - match: [{sourceNamespace: team}]
    directResponse: {status: 200, body: {string: team-rule}}
  - route: [{destination: {host: reviews, subset: v1}}]
`)
	// The team rule's own answer says the VirtualService has arrived.
	testkit.EventuallyErr(t, waitTimeout, "the VirtualService to reach the waypoint", func() error {
		code, body, err := w.tryGetFrom(teamPod, "/x")
		if err != nil {
			return err
		}
		if code != 200 || body != "team-rule" {
			return fmt.Errorf("it answered %d %q", code, body)
		}
		return nil
	})
	for _, tc := range []struct {
		pod  *testcluster.Pod
		want string
	}{
		{canary, "reviews-v2 path=/x"},
		{teamPod, "team-rule"},
		{w.Client, "reviews-v1 path=/x"},
	} {
		for range 5 {
			if code, body := w.getFrom(t, tc.pod, "/x"); code != 200 || body != tc.want {
				t.Errorf("GET /x from %s/%s = %d %q, want %q", tc.pod.Namespace, tc.pod.Name, code, body, tc.want)
			}
		}
	}
}
