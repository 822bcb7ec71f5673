package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

// l7Policy denies /admin* on service l7/web at the waypoint.
const l7Policy = `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: l7}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: DENY
  rules: [{to: [{operation: {paths: ["/admin*"]}}]}]
`

// l7 adds an HTTP service bound to the waypoint, applies an L7 DENY on
// /admin*, and shows a denied and an allowed path with the deciding policy
// from the waypoint's access log.
func (d *demo) l7(ctx context.Context) (string, error) {
	if err := d.m.AddNamespace("l7", map[string]string{"istio.io/dataplane-mode": "ambient"}); err != nil {
		return "", err
	}
	web, err := d.m.AddPod(ctx, 1, testcluster.PodSpec{Name: "web", Namespace: "l7", ServiceAccount: "web", Labels: map[string]string{"app": "web"}})
	if err != nil {
		return "", err
	}
	if _, err := d.m.AddService(testcluster.ServiceSpec{Name: "web", Namespace: "l7", Selector: map[string]string{"app": "web"},
		Labels: map[string]string{"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "demo"},
		Ports:  []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}}); err != nil {
		return "", err
	}
	if err := d.m.ServeHTTP(web, 8080, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "web %s", r.URL.Path)
	})); err != nil {
		return "", err
	}
	if err := d.m.SyncKubeProxy(); err != nil {
		return "", err
	}
	client := d.pod("demo", "client")
	if err := d.m.WaitForWorkloads(ctx, web.IP); err != nil {
		return "", err
	}
	if err := d.m.Apply("demo-l7-deny-admin", []byte(l7Policy)); err != nil {
		return "", err
	}
	vip := netip.AddrPortFrom(d.m.Service("l7", "web"), 80)
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return client.Dial(ctx, "tcp", vip.String()) }}}
	get := func(path string) (int, string, error) {
		resp, err := hc.Get("http://web.l7.svc.cluster.local" + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	// The policy takes one push to reach the waypoint.
	for {
		code, _, err := get("/admin")
		if err == nil && code == http.StatusForbidden {
			break
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("GET /admin never denied (last: %d, %v): %w", code, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	code, body, err := get("/catalog")
	if err != nil || code != http.StatusOK {
		return "", fmt.Errorf("GET /catalog = %d %q, %v; want 200", code, body, err)
	}
	denied, err := d.wp.WaitAccessLog(ctx, meshlab.Fields(map[string]string{"path": "/admin", "code": "403"}))
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("GET /admin 403 (policy %s), GET /catalog 200 (%q)", denied.Str("authz.policy"), body), nil
}
