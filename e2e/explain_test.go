package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// zctlExplanation is the part of `zctl explain -o json` the tests read.
type zctlExplanation struct {
	Verdict string `json:"verdict"`
	Policy  string `json:"policy"`
	Steps   []struct {
		Step, Result, By, Detail string
	} `json:"steps"`
	Indirect *struct {
		Direct, DirectBy, ViaWaypoint, ViaWaypointBy, Waypoint string
	} `json:"indirect"`
}

// step returns the first step named name ("" fields when none).
func (e *zctlExplanation) step(name string) (result, by, detail string) {
	for _, s := range e.Steps {
		if s.Step == name {
			return s.Result, s.By, s.Detail
		}
	}
	return "", "", ""
}

// zctl returns the freshly built zctl binary (built once per test process).
func zctl(t *testing.T) string {
	t.Helper()
	return filepath.Join(testkit.BuildBinaries(t, binDir, "zctl"), "zctl")
}

// forwardAdmin makes an admin endpoint inside a network namespace (a node
// or a pod: anything that dials there) reachable on a loopback port of the
// test's own namespace, as `kubectl port-forward` does for a real cluster,
// so zctl reads the live endpoint.
func forwardAdmin(t *testing.T, ns interface {
	Dial(context.Context, string, string) (net.Conn, error)
}, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Every forwarding goroutine ends before the test's later cleanups run
	// (they close the namespaces the dials enter).
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil {
			return false
		}
		conns[c] = struct{}{}
		return true
	}
	t.Cleanup(func() {
		cancel()
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !track(c) {
				c.Close()
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
				up, err := ns.Dial(dctx, "tcp", addr)
				dcancel()
				if err != nil || !track(up) {
					if up != nil {
						up.Close()
					}
					return
				}
				defer up.Close()
				done := make(chan struct{})
				go func() { _, _ = io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); close(done) }()
				_, _ = io.Copy(c, up)
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}

// runExplain runs the zctl binary's explain -o json with args and returns
// its answer and exit code (3: denied).
func runExplain(t *testing.T, args ...string) (*zctlExplanation, int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, zctl(t), append([]string{"explain", "-o", "json"}, args...)...)
	out, err := cmd.Output()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("zctl explain %q: %v", args, err)
	}
	var e zctlExplanation
	if jerr := json.Unmarshal(out, &e); jerr != nil {
		stderr := ""
		if exit != nil {
			stderr = string(exit.Stderr)
		}
		t.Fatalf("zctl explain %q (exit %d): %v\n%s%s", args, code, jerr, out, stderr)
	}
	return &e, code, string(out)
}

// TestExplainLive runs the zctl binary's explain against the live node
// proxy admin of a two-node mesh for an allowed and a denied flow, and
// checks that it says what the connection actually did: the echo answers
// for the allowed one (its node proxy logs it without error, from the
// client's identity) and is refused for the denied one, by the policy the
// destination node proxy's access log names.
func TestExplainLive(t *testing.T) {
	roottest.Require(t)
	m, err := meshlab.Start(t, meshlab.Options{Name: "explain"})
	if err != nil {
		t.Fatal(err)
	}
	zctl(t)
	ctx := ctxT(t, 90*time.Second)
	if err := m.AddNamespace("xl", ambientNS); err != nil {
		t.Fatal(err)
	}
	server, err := m.AddPod(ctx, 1, testcluster.PodSpec{Name: "xl-server", Namespace: "xl", ServiceAccount: "xl-server",
		Labels:     map[string]string{"app": "xl-server"},
		Containers: []kube.Container{{Name: "app", Ports: []kube.ContainerPort{{Name: "tcp-echo", Port: 9000}}}}})
	if err != nil {
		t.Fatal(err)
	}
	good, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: "xl-good", Namespace: "xl", ServiceAccount: "xl-good"})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: "xl-bad", Namespace: "xl", ServiceAccount: "xl-bad"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddService(testcluster.ServiceSpec{Name: "xl-server", Namespace: "xl", Selector: map[string]string{"app": "xl-server"},
		Ports: []kube.ServicePort{{Name: "tcp-echo", Port: 90, TargetPort: 9000}}}); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, server.IP, good.IP, bad.IP); err != nil {
		t.Fatal(err)
	}
	apply(t, m, "e2e-explain-live", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-good, namespace: xl}
spec:
  selector: {matchLabels: {app: xl-server}}
  rules: [{from: [{source: {principals: ["cluster.local/ns/xl/sa/xl-good", "cluster.local/ns/xl/sa/xl-bad"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-bad, namespace: xl}
spec:
  selector: {matchLabels: {app: xl-server}}
  action: DENY
  rules: [{from: [{source: {principals: ["cluster.local/ns/xl/sa/xl-bad"]}}]}]
`)
	vip := netip.AddrPortFrom(m.Service("xl", "xl-server"), 90)
	// What the connections do, once the destination's node proxy holds
	// both policies. Waiting for a refusal instead is not enough: a
	// connection in flight when the DENY arrives is closed as revoked,
	// and then no connection is ever refused by policy.
	for _, key := range []string{"xl/allow-good", "xl/deny-bad"} {
		if err := waitNodePolicy(ctx, m, 1, key, false); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := meshlab.RoundTrip(ctxT(t, 5*time.Second), bad, vip, []byte("bad")); err == nil && len(got) > 0 {
		t.Fatalf("the DENY policy let xl-bad through: %q", got)
	}
	denied, err := m.WaitAccessLog(ctx, 1, func(a meshlab.AccessLog) bool {
		return a.Str("dst.workload") == "xl-server" && a.Str("reason") == "policy_denied" && a.Str("src.identity") == spiffe("xl", "xl-bad")
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := meshlab.RoundTrip(ctx, good, vip, []byte("good")); err != nil || string(got) != "good" {
		t.Fatalf("xl-good → %s: %q, %v", vip, got, err)
	}
	allowed, err := m.WaitAccessLog(ctx, 1, func(a meshlab.AccessLog) bool {
		return a.Str("direction") == "inbound" && a.Str("dst.workload") == "xl-server" && a.Str("src.identity") == spiffe("xl", "xl-good")
	})
	if err != nil {
		t.Fatal(err)
	}
	if allowed.Str("error") != "" || allowed.Str("reason") == "policy_denied" {
		t.Errorf("the allowed connection's log line: %v", allowed)
	}

	admin := forwardAdmin(t, m.Node(0), meshlab.ProxyAdminAddr)
	// The allowed flow, by the service's DNS name.
	e, code, out := runExplain(t, "--admin", admin, "xl/xl-good", "xl-server.xl.svc.cluster.local:90")
	if code != 0 || e.Verdict != "ALLOW" || e.Policy != "xl/allow-good" {
		t.Errorf("allowed flow: exit %d verdict %s by %q, want ALLOW by xl/allow-good\n%s", code, e.Verdict, e.Policy, out)
	}
	if _, _, detail := e.step("authz"); !strings.Contains(detail, "sees "+spiffe("xl", "xl-good")+" (the client's, over mTLS)") {
		t.Errorf("allowed flow: the node proxy's identity %q, want the client's as logged (%s)", detail, allowed.Str("src.identity"))
	}
	if r, _, _ := e.step("dns"); !strings.Contains(r, vip.Addr().String()) {
		t.Errorf("dns step %q, want the VIP %s", r, vip.Addr())
	}
	// The denied flow: the same policy the proxy's log names.
	e, code, out = runExplain(t, "--admin", admin, "xl/xl-bad", vip.String())
	if code != 3 || e.Verdict != "DENY" || e.Policy != "xl/deny-bad" {
		t.Errorf("denied flow: exit %d verdict %s by %q, want DENY by xl/deny-bad\n%s", code, e.Verdict, e.Policy, out)
	}
	if !strings.HasSuffix(denied.Str("error"), "denied by "+e.Policy) {
		t.Errorf("the proxy denied with %q, zctl names %q", denied.Str("error"), e.Policy)
	}
}

// TestWaypointIndirectPath: a client is denied direct access to a backend
// by an L4 policy (enforced by the backend's node proxy, which sees the
// client) and allowed through the waypoint by the waypoint's policy (the
// node proxy then sees the waypoint). The connection through the waypoint
// succeeds, a direct one is refused, and `zctl explain`, reading the live
// node proxy's and waypoint's admin endpoints, shows both decisions with
// their policies and flags the indirect path.
func TestWaypointIndirectPath(t *testing.T) {
	roottest.Require(t)
	zctl(t)
	ctx := ctxT(t, 90*time.Second)
	w := startWaypointMesh(t, ctx, waypointSpec{Options: meshlab.Options{Name: "indirect"}, Namespace: "ind", Service: "web",
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "web path=%s", r.URL.Path)
		})})
	m, wp, web, client := w.Mesh, w.WP, w.Servers[0], w.Client
	apply(t, m, "e2e-indirect", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-curl-direct, namespace: ind}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{from: [{source: {principals: ["cluster.local/ns/ind/sa/curl"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-curl-via-waypoint, namespace: ind}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  rules:
  - from: [{source: {principals: ["cluster.local/ns/ind/sa/curl"]}}]
    to: [{operation: {methods: [GET]}}]
`)
	vip := m.Service("ind", "web")
	get := func(dst netip.AddrPort) (int, error) {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return client.Dial(ctx, "tcp", dst.String()) }}}
		resp, err := hc.Get("http://web.ind.svc.cluster.local/hello")
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	// Both policies have arrived once the direct connection is refused and
	// the waypoint names its ALLOW for a request that passes.
	testkit.Eventually(t, 30*time.Second, "the direct connection refused by the L4 DENY", func() bool {
		_, err := get(netip.AddrPortFrom(web.IP, 8080))
		return err != nil
	})
	// The failure above may be a connection in flight that the policy's
	// arrival closed (logged "revoked"); a new one must be refused outright.
	if _, err := get(netip.AddrPortFrom(web.IP, 8080)); err == nil {
		t.Fatal("a new direct connection passed the L4 DENY")
	}
	if _, err := m.WaitAccessLog(ctx, 1, func(a meshlab.AccessLog) bool {
		return a.Str("dst.workload") == "web" && a.Str("reason") == "policy_denied" &&
			strings.HasSuffix(a.Str("error"), "denied by ind/deny-curl-direct") && a.Str("src.identity") == spiffe("ind", "curl")
	}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "GET through the waypoint answers 200", func() bool {
		code, err := get(netip.AddrPortFrom(vip, 80))
		return err == nil && code == http.StatusOK
	})
	if _, err := wp.WaitAccessLog(ctx, func(a meshlab.AccessLog) bool {
		return a.Str("path") == "/hello" && a.Str("code") == "200" && a.Str("authz.policy") == "ind/allow-curl-via-waypoint" &&
			a.Str("src.identity") == spiffe("ind", "curl")
	}); err != nil {
		t.Fatal(err)
	}

	admin := forwardAdmin(t, m.Node(0), meshlab.ProxyAdminAddr)
	wpAdmin := forwardAdmin(t, wp.Pod, meshlab.WaypointAdminAddr)
	wpRef := "Gateway/demo/waypoint"

	t.Run("through the waypoint", func(t *testing.T) {
		e, code, out := runExplain(t, "--admin", admin, "--waypoint-admin", wpAdmin, "--path", "/hello", "ind/curl", "web.ind.svc.cluster.local:80")
		if code != 0 || e.Verdict != "ALLOW" || e.Policy != "ind/allow-curl-via-waypoint" {
			t.Fatalf("exit %d verdict %s by %q, want ALLOW by the waypoint's policy (the node proxy has no ALLOW)\n%s", code, e.Verdict, e.Policy, out)
		}
		if r, by, detail := e.step("waypoint authz"); !strings.HasPrefix(r, "ALLOW") || by != "AuthorizationPolicy/ind/allow-curl-via-waypoint" ||
			!strings.Contains(detail, "sees "+spiffe("ind", "curl")+" (the client's") {
			t.Errorf("waypoint authz: %q by %q (%s)", r, by, detail)
		}
		if r, _, detail := e.step("authz"); !strings.HasPrefix(r, "ALLOW") || !strings.Contains(detail, "sees "+spiffe("demo", "waypoint")+" (the waypoint's") {
			t.Errorf("node proxy authz: %q (%s), want ALLOW seeing the waypoint", r, detail)
		}
		ip := e.Indirect
		if ip == nil || ip.Direct != "DENY" || ip.DirectBy != "denied by ind/deny-curl-direct" || ip.ViaWaypoint != "ALLOW" ||
			!strings.Contains(ip.ViaWaypointBy, "allowed by ind/allow-curl-via-waypoint") || ip.Waypoint != wpRef {
			t.Errorf("indirect path: %+v\n%s", ip, out)
		}
		if r, by, _ := e.step("indirect path"); r != "denied direct, allowed through the waypoint" ||
			by != "AuthorizationPolicy/ind/deny-curl-direct vs AuthorizationPolicy/ind/allow-curl-via-waypoint" {
			t.Errorf("indirect path step: %q by %q", r, by)
		}
	})
	t.Run("direct to the pod", func(t *testing.T) {
		e, code, out := runExplain(t, "--admin", admin, "--waypoint-admin", wpAdmin, "--path", "/hello", "ind/curl", netip.AddrPortFrom(web.IP, 8080).String())
		if code != 3 || e.Verdict != "DENY" || e.Policy != "ind/deny-curl-direct" {
			t.Fatalf("exit %d verdict %s by %q, want DENY by ind/deny-curl-direct (as the node proxy logged)\n%s", code, e.Verdict, e.Policy, out)
		}
		if ip := e.Indirect; ip == nil || ip.Direct != "DENY" || ip.ViaWaypoint != "ALLOW" || !strings.HasPrefix(ip.Waypoint, wpRef) {
			t.Errorf("indirect path: %+v\n%s", ip, out)
		}
	})
	t.Run("the table", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, zctl(t), "explain", "--admin", admin, "--waypoint-admin", wpAdmin, "--path", "/hello",
			"ind/curl", "web.ind.svc.cluster.local:80").CombinedOutput()
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, want := range []string{"waypoint:     " + wpRef + " admin http://" + wpAdmin + "/config_dump", "waypoint authz", "indirect path", "verdict"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("table lacks %q", want)
			}
		}
		t.Logf("zctl explain (table):\n%s", out)
	})
	t.Run("no request given", func(t *testing.T) {
		e, code, out := runExplain(t, "--admin", admin, "--waypoint-admin", wpAdmin, "ind/curl", netip.AddrPortFrom(vip, 80).String())
		if code != 4 || e.Verdict != "DEPENDS" {
			t.Errorf("exit %d verdict %s, want 4 DEPENDS (the waypoint's ALLOW reads the method)\n%s", code, e.Verdict, out)
		}
	})
}
