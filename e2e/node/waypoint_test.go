package node

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestNodeWaypoint: the chart's control plane deploys a waypoint on the
// kubelet for a Gateway of class istio-waypoint that `zctl waypoint apply
// --enroll-namespace --wait` writes (README step 8); the waypoint enforces
// an AuthorizationPolicy attached to its Gateway (GET /admin denied, 403
// "RBAC: access denied") and applies an HTTPRoute bound to the Service
// (a request header added) between two ambient pods. The traffic is proven
// to pass through the waypoint: the waypoint's access log has a line per
// request, its istio_requests_total counts them, and the server's node
// proxy sees the waypoint's identity as the source.
func TestNodeWaypoint(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	start := time.Now()
	const ns, gw = "wp", "waypoint"
	// Registered first, so it runs after the namespace's own cleanup has
	// deleted it: the tests after this one (the uninstall last) start
	// with the waypoint, its Service and pods gone.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			if _, err := e.node.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Errorf("namespace %s still there 60s after its deletion", ns)
	})
	e.namespace(t, ns, true)
	ctx := testCtx(t, 3*time.Minute)

	// zctl (built here) against the node's admin kubeconfig, as a user
	// runs it; the server and client pods start meanwhile.
	type result struct {
		out string
		err error
	}
	applied := make(chan result, 1)
	zctl := filepath.Join(t.TempDir(), "zctl")
	go func() {
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", zctl, "../../cmd/zctl").CombinedOutput(); err != nil {
			applied <- result{string(out), fmt.Errorf("go build zctl: %w", err)}
			return
		}
		out, err := exec.CommandContext(ctx, zctl, "waypoint", "apply", "--kubeconfig", e.node.Kubeconfig,
			"-n", ns, "--enroll-namespace", "--wait").CombinedOutput()
		applied <- result{string(out), err}
	}()
	srv := e.pod(t, ns, "srv", map[string]string{"app": "srv"}, "serve", "-headers", "-close")
	e.pod(t, ns, "cli", nil, "pause")
	svc, err := e.node.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "srv", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "srv"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := <-applied
	if r.err != nil {
		t.Fatalf("zctl waypoint apply: %v\n%s\nevents:\n%s", r.err, r.out, e.events(ns))
	}
	t.Logf("zctl waypoint apply (%v after the test started):\n%s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(r.out))

	// The Deployment ztunnel-cp made is Available and the Gateway Programmed.
	dep, err := e.node.Client.AppsV1().Deployments(ns).Get(ctx, gw, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("waypoint Deployment: %v", err)
	}
	if !deploymentAvailable(dep) {
		t.Fatalf("waypoint Deployment not Available: %+v", dep.Status.Conditions)
	}
	programmed, err := e.node.Kubectl(ctx, "get", "gateways.gateway.networking.k8s.io", gw, "-n", ns,
		"-o", `jsonpath={.status.conditions[?(@.type=="Programmed")].status}`)
	if err != nil || programmed != "True" {
		t.Fatalf("Gateway %s/%s Programmed=%q (%v), want True", ns, gw, programmed, err)
	}
	wp := e.waypointPod(t, ctx, dep)
	wpID := fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/%s", ns, wp.Spec.ServiceAccountName)
	// It came up at the first start: no crash while the root ConfigMap,
	// token or xDS was not there yet.
	for _, cs := range wp.Status.ContainerStatuses {
		if cs.RestartCount > 0 {
			prev, _ := e.node.Kubectl(ctx, "logs", "-n", ns, wp.Name, "-c", cs.Name, "--previous", "--tail=30")
			t.Errorf("waypoint container %s restarted %d times; its previous log:\n%s", cs.Name, cs.RestartCount, prev)
		}
	}
	t.Logf("waypoint pod %s (%s) Ready as %s", wp.Name, wp.Status.PodIP, wpID)

	e.apply(t, fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: %[1]s}
spec:
  targetRefs:
  - {group: gateway.networking.k8s.io, kind: Gateway, name: %[2]s}
  action: DENY
  rules:
  - to: [{operation: {methods: [GET], paths: [/admin]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: srv, namespace: %[1]s}
spec:
  parentRefs:
  - {group: "", kind: Service, name: srv, port: 80}
  rules:
  - filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        add: [{name: X-Via-Route, value: wp-srv}]
    backendRefs:
    - {name: srv, port: 80}
`, ns, gw))

	base := "http://" + svc.Spec.ClusterIP
	const added = "header X-Via-Route: wp-srv"
	// The node proxy learns the waypoint binding, the waypoint the policy
	// and the route, through xDS: retry until both are in force.
	applyAt := time.Now()
	waitUntil(t, 60*time.Second, func() error {
		if out, err := e.get(ctx, ns, "cli", base+"/ok"); err != nil || !strings.Contains(out, added) {
			return fmt.Errorf("GET /ok: %v %q, want the route's header at the server", err, out)
		}
		if out, err := e.get(ctx, ns, "cli", base+"/admin"); err == nil || !strings.Contains(out, "403 Forbidden: RBAC: access denied") {
			return fmt.Errorf("GET /admin: %v %q, want 403 RBAC: access denied", err, out)
		}
		return nil
	})
	t.Logf("policy and route in force %v after they were applied", time.Since(applyAt).Round(time.Millisecond))

	before := e.waypointRequests(t, ctx, wp)
	time.Sleep(time.Second) // the log's sinceTime below starts after the waits' requests
	since := time.Now()
	const n = 3
	var ok string
	for range n {
		out, err := e.get(ctx, ns, "cli", base+"/admin")
		if err == nil || !strings.Contains(out, "403 Forbidden: RBAC: access denied") {
			t.Errorf("GET /admin: %v %q, want 403 RBAC: access denied", err, out)
		}
		if ok, err = e.get(ctx, ns, "cli", base+"/ok"); err != nil || !strings.Contains(ok, added) {
			t.Errorf("GET /ok: %v %q, want 200 with %q", err, ok, added)
		}
	}
	t.Logf("GET /ok answered:\n%s", strings.TrimSpace(ok))
	// The server saw the connection come from the waypoint's pod.
	if !strings.Contains(ok, "from="+wp.Status.PodIP+":") {
		t.Errorf("server saw GET /ok from another address than the waypoint pod %s:\n%s", wp.Status.PodIP, ok)
	}

	// 1. The waypoint's access log: one line per request, with its verdict.
	var reqs []logLine
	waitUntil(t, 20*time.Second, func() error {
		lines, err := e.podLog(ctx, ns, wp.Name, since)
		if err != nil {
			return err
		}
		reqs = reqs[:0]
		for _, l := range lines {
			if l.str("logger") == "access" && l.str("msg") == "request" && (l.str("path") == "/admin" || l.str("path") == "/ok") {
				reqs = append(reqs, l)
			}
		}
		if len(reqs) < 2*n {
			return fmt.Errorf("%d waypoint access-log lines for srv, want %d:\n%s", len(reqs), 2*n, dumpLines(lines))
		}
		return nil
	})
	codes := map[string]int{}
	for _, l := range reqs {
		code, _ := l.Fields["code"].(float64)
		codes[fmt.Sprintf("%s %s %d", l.str("method"), l.str("path"), int(code))]++
		if l.str("path") == "/admin" && !strings.Contains(l.str("authz.policy"), "deny-admin") {
			t.Errorf("denied request's access-log line names policy %q, want %s/deny-admin", l.str("authz.policy"), ns)
		}
	}
	if codes["GET /admin 403"] != n || codes["GET /ok 200"] != n || len(reqs) != 2*n {
		t.Errorf("waypoint access log %v, want %d of GET /admin 403 and of GET /ok 200 and nothing else", codes, n)
	}
	t.Logf("waypoint access log: %v; a line: %s", codes, dumpLines(reqs[:1]))

	// 2. Its metrics (the pod's :15020, reached from the node).
	if before != nil {
		after := e.waypointRequests(t, ctx, wp)
		for _, code := range []string{"200", "403"} {
			if d := after[code] - before[code]; d != n {
				t.Errorf("istio_requests_total{response_code=%q} for srv rose by %v, want %d (before %v after %v)", code, d, n, before, after)
			}
		}
		t.Logf("waypoint istio_requests_total for srv by code: before %v, after %v", before, after)
	}

	// 3. The server's node proxy: the inbound connections to the server
	// came from the waypoint, with the waypoint's identity (the server
	// closes each connection, so each is logged at once).
	dst := netip.AddrPortFrom(netip.MustParseAddr(srv.Status.PodIP), 8080)
	in, _, _ := e.accessLog(t, ctx, since, wp.Status.PodIP, dst, n, 0)
	for _, l := range in {
		if got := l.str("src.identity"); got != wpID {
			t.Errorf("server's node proxy saw src.identity %q, want the waypoint's %s", got, wpID)
		}
	}
	if len(in) < n {
		t.Errorf("%d inbound node-proxy lines from the waypoint %s to %s, want at least %d (one per allowed request)", len(in), wp.Status.PodIP, dst, n)
	} else {
		t.Logf("node proxy: %d inbound connections from the waypoint %s as %s", len(in), wp.Status.PodIP, wpID)
	}
	t.Logf("waypoint test body %v", time.Since(start).Round(time.Millisecond))
}

func deploymentAvailable(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// waypointPod is the Deployment's running, Ready pod.
func (e *nodeEnv) waypointPod(t *testing.T, ctx context.Context, dep *appsv1.Deployment) *corev1.Pod {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := e.node.Client.CoreV1().Pods(dep.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; podReady(p) && p.DeletionTimestamp == nil {
			return p
		}
	}
	t.Fatalf("no Ready pod of Deployment %s/%s among %d", dep.Namespace, dep.Name, len(pods.Items))
	return nil
}

// waypointRequests sums the waypoint's istio_requests_total for the srv
// Service by response code, from its :15020/metrics; nil (logged) when the
// node cannot reach it.
func (e *nodeEnv) waypointRequests(t *testing.T, ctx context.Context, wp *corev1.Pod) map[string]float64 {
	t.Helper()
	url := "http://" + net.JoinHostPort(wp.Status.PodIP, "15020") + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Logf("waypoint metrics %s not reachable from the node: %v", url, err)
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s: %s", url, resp.Status, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "istio_requests_total{") || !strings.Contains(l, `destination_service_name="srv"`) {
			continue
		}
		_, code, ok := strings.Cut(l, `response_code="`)
		if !ok {
			continue
		}
		code, _, _ = strings.Cut(code, `"`)
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", l, err)
		}
		out[code] += v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return out
}
