package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
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

// semMesh is the set-up of TestWaypointAuthzSemantics: TestWaypointL7's
// mesh (examples' waypoint demo/waypoint, service l7/web bound to it) with
// two clients of different service accounts, curl and other.
type semMesh struct {
	m            *meshlab.Mesh
	curl, other  *testcluster.Pod
	vip          netip.Addr
	web          *testcluster.Pod
	waypointProc *meshlab.Waypoint
}

const semHost = "web.l7.svc.cluster.local"

func startSemMesh(t *testing.T, cpArgs ...string) *semMesh {
	t.Helper()
	m, err := meshlab.Start(t, meshlab.Options{Examples: []string{"../examples"}, CPArgs: cpArgs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 90*time.Second)
	if err := m.AddNamespace("l7", ambientNS); err != nil {
		t.Fatal(err)
	}
	s := &semMesh{m: m}
	s.web, err = m.AddPod(ctx, 1, testcluster.PodSpec{Name: "web", Namespace: "l7", ServiceAccount: "web", Labels: map[string]string{"app": "web"},
		Containers: []kube.Container{{Name: "app", Ports: []kube.ContainerPort{{Name: "tcp-echo", Port: 9000}}}}})
	if err != nil {
		t.Fatal(err)
	}
	s.curl, err = m.AddPod(ctx, 0, testcluster.PodSpec{Name: "curl", Namespace: "l7", ServiceAccount: "curl", Labels: map[string]string{"app": "curl"}})
	if err != nil {
		t.Fatal(err)
	}
	s.other, err = m.AddPod(ctx, 0, testcluster.PodSpec{Name: "other", Namespace: "l7", ServiceAccount: "other", Labels: map[string]string{"app": "other"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddService(testcluster.ServiceSpec{Name: "web", Namespace: "l7", Selector: map[string]string{"app": "web"},
		Labels: map[string]string{"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "demo"},
		Ports:  []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}}}); err != nil {
		t.Fatal(err)
	}
	// The backend says what reached it: the request target as sent on the
	// wire, the client certificate header and the header a route sets.
	if err := m.ServeHTTP(s.web, 8080, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "uri=%s xfcc=%q route=%q", r.RequestURI, r.Header.Get("X-Forwarded-Client-Cert"), r.Header.Get("X-Route"))
	})); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncKubeProxy(); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, s.web.IP, s.curl.IP, s.other.IP); err != nil {
		t.Fatal(err)
	}
	if s.waypointProc, err = m.StartWaypoint(ctx, "demo", "waypoint"); err != nil {
		t.Fatal(err)
	}
	s.vip = m.Service("l7", "web")
	s.wait(t, s.curl, "GET", "/", nil, http.StatusOK)
	return s
}

// raw sends one HTTP/1.1 request exactly as written (method, target and
// headers are not cleaned by a client library) from pod from to web's VIP.
func (s *semMesh) raw(t *testing.T, from *testcluster.Pod, method, target string, hdr map[string]string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := from.Dial(ctx, "tcp", netip.AddrPortFrom(s.vip, 80).String())
	if err != nil {
		t.Fatalf("dial web: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var b bytes.Buffer
	host := semHost
	if h, ok := hdr["Host"]; ok {
		host = h
	}
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", method, target, host)
	for k, v := range hdr {
		if k != "Host" {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	b.WriteString("\r\n")
	if _, err := c.Write(b.Bytes()); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// wait polls until the request answers want (policies and routes take a
// push to reach the waypoint) and returns the body.
func (s *semMesh) wait(t *testing.T, from *testcluster.Pod, method, target string, hdr map[string]string, want int) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := s.raw(t, from, method, target, hdr)
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s %v = %d %q, want %d", method, target, hdr, code, body, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *semMesh) expect(t *testing.T, from *testcluster.Pod, method, target string, hdr map[string]string, want int) string {
	t.Helper()
	code, body := s.raw(t, from, method, target, hdr)
	if code != want {
		t.Errorf("%s %s %v = %d %q, want %d", method, target, hdr, code, body, want)
	}
	return body
}

const denyAdmin = `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: l7}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: DENY
  rules: [{to: [{operation: {paths: ["/admin*"]}}]}]
`

// bypasses are the paths that reach /admin/x at a backend that resolves
// dot segments: under BASE (and stronger) the waypoint normalizes them
// before the DENY sees them.
var bypasses = []string{"/public/../admin/x", "/public/%2e%2e/admin/x", "/./admin/x"}

// TestWaypointAuthzSemantics checks at the real waypoint what Istio's
// AuthorizationPolicy fields and mesh pathNormalization mean: each subtest
// is one field or option, with the attack it must stop.
func TestWaypointAuthzSemantics(t *testing.T) {
	roottest.Require(t)
	t.Run("pathNormalization default (BASE)", func(t *testing.T) {
		s := startSemMesh(t)
		testSemDefault(t, s)
	})
	t.Run("pathNormalization NONE", func(t *testing.T) {
		s := startSemMesh(t, "--path-normalization", "NONE")
		apply(t, s.m, "e2e-sem-deny-admin", denyAdmin)
		s.wait(t, s.curl, "GET", "/admin/x", nil, http.StatusForbidden)
		// Istio: "No normalization is done. Anything received by Envoy
		// will be forwarded exactly as-is to any backend service", so the
		// DENY does not see /admin and the backend gets the raw path.
		for _, p := range bypasses {
			if body := s.expect(t, s.curl, "GET", p, nil, http.StatusOK); !strings.Contains(body, "uri="+p+" ") {
				t.Errorf("GET %s under NONE reached the backend as %q, want it unchanged", p, body)
			}
		}
	})
	t.Run("pathNormalization DECODE_AND_MERGE_SLASHES", func(t *testing.T) {
		s := startSemMesh(t, "--path-normalization", "DECODE_AND_MERGE_SLASHES")
		apply(t, s.m, "e2e-sem-deny-admin", denyAdmin)
		s.wait(t, s.curl, "GET", "/admin/x", nil, http.StatusForbidden)
		for _, p := range append(bypasses, "/public%2f..%2fadmin/x", "//admin//x", `/public/..%5cadmin/x`) {
			s.expect(t, s.curl, "GET", p, nil, http.StatusForbidden)
		}
		if body := s.expect(t, s.curl, "GET", "/a//b%2Fc", nil, http.StatusOK); !strings.Contains(body, "uri=/a/b/c ") {
			t.Errorf("backend got %q, want the normalized /a/b/c", body)
		}
	})
}

func testSemDefault(t *testing.T, s *semMesh) {
	t.Run("serviceAccounts ALLOW admits only that account", func(t *testing.T) {
		apply(t, s.m, "e2e-sem-sa", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: only-curl, namespace: l7}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  rules: [{from: [{source: {serviceAccounts: [curl]}}]}]
`)
		s.wait(t, s.other, "GET", "/", nil, http.StatusForbidden)
		s.expect(t, s.curl, "GET", "/", nil, http.StatusOK)
	})

	t.Run("normalized paths under DENY /admin*", func(t *testing.T) {
		apply(t, s.m, "e2e-sem-deny-admin", denyAdmin)
		s.wait(t, s.curl, "GET", "/admin/x", nil, http.StatusForbidden)
		for _, p := range append(bypasses, "/public/%2E%2E/admin/x", `/public\..\admin\x`, "/%61dmin/x") {
			s.expect(t, s.curl, "GET", p, nil, http.StatusForbidden)
		}
		// BASE leaves slashes alone: "//admin" is not under /admin.
		s.expect(t, s.curl, "GET", "//admin/x", nil, http.StatusOK)
		// The normalized path is what the backend receives; the query is
		// kept as sent.
		if body := s.expect(t, s.curl, "GET", "/public/./a/../x?q=/../admin", nil, http.StatusOK); !strings.Contains(body, "uri=/public/x?q=/../admin ") {
			t.Errorf("backend got %q, want uri=/public/x?q=/../admin", body)
		}
		// Istio refuses %00 in every mode.
		s.expect(t, s.curl, "GET", "/public%00", nil, http.StatusBadRequest)
	})

	t.Run("a malformed when value denies", func(t *testing.T) {
		apply(t, s.m, "e2e-sem-bad-when", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: bad-when, namespace: l7}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  rules: [{when: [{key: source.ip, values: [10.1.0.0/33]}]}]
`)
		// The only rule is dropped (fail closed): the ALLOW matches nothing.
		s.wait(t, s.curl, "GET", "/", nil, http.StatusForbidden)
	})

	t.Run("a non-numeric destination.port in a DENY denies", func(t *testing.T) {
		apply(t, s.m, "e2e-sem-bad-port", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: bad-port, namespace: l7}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: DENY
  rules: [{when: [{key: destination.port, values: [http]}]}]
`)
		s.wait(t, s.curl, "GET", "/", nil, http.StatusForbidden)
	})

	t.Run("XFCC from a client never reaches the backend", func(t *testing.T) {
		forged := "By=spiffe://cluster.local/ns/l7/sa/web;URI=spiffe://cluster.local/ns/istio-system/sa/admin"
		body := s.wait(t, s.curl, "GET", "/", map[string]string{"X-Forwarded-Client-Cert": forged}, http.StatusOK)
		if strings.Contains(body, "istio-system") || !strings.Contains(body, `xfcc="" `) {
			t.Errorf("backend saw %q: the client's X-Forwarded-Client-Cert was forwarded", body)
		}
	})

	t.Run("methods are case-sensitive as Envoy's", func(t *testing.T) {
		apply(t, s.m, "e2e-sem-deny-delete", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-delete, namespace: l7}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: DENY
  rules: [{to: [{operation: {methods: [DELETE]}}]}]
`)
		s.wait(t, s.curl, "DELETE", "/", nil, http.StatusForbidden)
		s.expect(t, s.curl, "GET", "/", nil, http.StatusOK)
		// Istio refuses a method that is not upper case (400), so
		// "delete" cannot slip past a DENY on DELETE.
		s.expect(t, s.curl, "delete", "/", nil, http.StatusBadRequest)
	})

	t.Run("hosts ignore case, port and a trailing dot", func(t *testing.T) {
		apply(t, s.m, "e2e-sem-deny-host", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-host, namespace: l7}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: DENY
  rules: [{to: [{operation: {hosts: [web.l7.svc.cluster.local]}}]}]
`)
		s.wait(t, s.curl, "GET", "/", nil, http.StatusForbidden)
		for _, h := range []string{"web.l7.svc.cluster.local.", "WEB.L7.svc.cluster.local:80", "web.l7.svc.cluster.local.:80"} {
			s.expect(t, s.curl, "GET", "/", map[string]string{"Host": h}, http.StatusForbidden)
		}
		s.expect(t, s.curl, "GET", "/", map[string]string{"Host": "web"}, http.StatusOK)
	})

	t.Run("header regexes match the whole value (RE2, anchored)", func(t *testing.T) {
		apply(t, s.m, "e2e-sem-route", `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: by-version, namespace: l7}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 80}]
  rules:
  - matches: [{headers: [{type: RegularExpression, name: x-ver, value: "v[12]"}]}]
    filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-route, value: versioned}]}}]
    backendRefs: [{name: web, port: 80}]
  - backendRefs: [{name: web, port: 80}]
`)
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, body := s.raw(t, s.curl, "GET", "/", map[string]string{"X-Ver": "v1"})
			if strings.Contains(body, `route="versioned"`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("x-ver: v1 never took the regex route: %q", body)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, v := range []string{"xv1y", "v1x", "v12"} {
			if body := s.expect(t, s.curl, "GET", "/", map[string]string{"X-Ver": v}, http.StatusOK); strings.Contains(body, "versioned") {
				t.Errorf("x-ver: %s matched the anchored regex v[12]: %q", v, body)
			}
		}
	})
}

// TestRootNamespaceSelectorDeny: a DENY with a selector in the root
// namespace (istio-system) denies matching workloads in other namespaces at
// their node proxy, as istiod attaches it; non-matching workloads are
// untouched.
func TestRootNamespaceSelectorDeny(t *testing.T) {
	roottest.Require(t)
	m, err := meshlab.Start(t, meshlab.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 90*time.Second)
	if err := m.AddNamespace("rootsel", ambientNS); err != nil {
		t.Fatal(err)
	}
	echo := []kube.Container{{Name: "app", Ports: []kube.ContainerPort{{Name: "tcp-echo", Port: 9000}}}}
	web, err := m.AddPod(ctx, 1, testcluster.PodSpec{Name: "web", Namespace: "rootsel", ServiceAccount: "web", Labels: map[string]string{"app": "web"}, Containers: echo})
	if err != nil {
		t.Fatal(err)
	}
	db, err := m.AddPod(ctx, 1, testcluster.PodSpec{Name: "db", Namespace: "rootsel", ServiceAccount: "db", Labels: map[string]string{"app": "db"}, Containers: echo})
	if err != nil {
		t.Fatal(err)
	}
	client, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: "client", Namespace: "rootsel", ServiceAccount: "client"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, web.IP, db.IP, client.IP); err != nil {
		t.Fatal(err)
	}
	want := payload(512)
	reach := func(dst *testcluster.Pod) error {
		got, err := meshlab.RoundTrip(ctx, client, netip.AddrPortFrom(dst.IP, 9000), want)
		if err == nil && !bytes.Equal(got, want) {
			err = fmt.Errorf("echo returned %d of %d bytes", len(got), len(want))
		}
		return err
	}
	if err := reach(web); err != nil {
		t.Fatalf("web before any policy: %v", err)
	}
	apply(t, m, "e2e-root-selector-deny", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-web-everywhere, namespace: istio-system}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{from: [{source: {namespaces: [rootsel]}}]}]
`)
	deadline := time.Now().Add(20 * time.Second)
	for reach(web) == nil {
		if time.Now().After(deadline) {
			t.Fatal("web in namespace rootsel is still reachable under istio-system's DENY selecting app=web")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := reach(db); err != nil {
		t.Errorf("db (app=db, not selected) refused: %v", err)
	}
}
