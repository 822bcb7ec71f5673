package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
)

// TestWaypointRedirectRewrite runs the routing filters through the real
// cmd/waypoint and node proxies, first as an HTTPRoute (Gateway API
// RequestRedirect, URLRewrite, ResponseHeaderModifier, a backendRef's
// RequestHeaderModifier, CORS), then as a VirtualService (redirect, rewrite with
// uri, authority and uriRegexRewrite, headers.response, per-destination
// headers, directResponse): redirects answer their code and Location
// without reaching the backend, rewrites reach it with the new path and
// Host, and response headers are changed on the way back.
func TestWaypointRedirectRewrite(t *testing.T) {
	// The mesh start takes most of it on a loaded machine.
	ctx := ctxT(t, 180*time.Second)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Backend", "echo")
		fmt.Fprintf(w, "path=%s host=%s x-dest=%s", r.URL.RequestURI(), r.Host, r.Header.Get("X-Dest"))
	})
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "rr", Service: "echo", Handler: handler})
	hc := *w.hc
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	w.hc = &hc
	host := "echo.rr.svc.cluster.local"
	// do returns the answer to GET path.
	do := func(t *testing.T, path string) (*http.Response, string) {
		t.Helper()
		resp, err := w.hc.Get(w.URL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	redirects := func(t *testing.T, path string, code int, location string) {
		t.Helper()
		resp, body := do(t, path)
		if resp.StatusCode != code || resp.Header.Get("Location") != location {
			t.Errorf("GET %s = %d Location %q (%q), want %d %q", path, resp.StatusCode, resp.Header.Get("Location"), body, code, location)
		}
		if strings.Contains(body, "path=") {
			t.Errorf("GET %s reached the backend: %q", path, body)
		}
	}
	reaches := func(t *testing.T, path, want string) *http.Response {
		t.Helper()
		resp, body := do(t, path)
		if resp.StatusCode != http.StatusOK || body != want {
			t.Errorf("GET %s = %d %q, want 200 %q", path, resp.StatusCode, body, want)
		}
		return resp
	}

	apply(t, w.Mesh, "e2e-wp-redirect-httproute", `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: filters, namespace: rr}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /original-prefix}}]
    filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /replacement-prefix}}}]
  - matches: [{path: {type: PathPrefix, value: /scheme}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, hostname: example.org, statusCode: 301}}]
  - matches: [{path: {type: PathPrefix, value: /port}}]
    filters: [{type: RequestRedirect, requestRedirect: {port: 8083, statusCode: 307}}]
  - matches: [{path: {type: PathPrefix, value: /prefix/one}}]
    filters:
    - {type: URLRewrite, urlRewrite: {hostname: rewritten.example, path: {type: ReplacePrefixMatch, replacePrefixMatch: /one}}}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: X-Header-Set, value: set}], add: [{name: X-Header-Add, value: added}], remove: [x-backend]}
    backendRefs:
    - name: echo
      port: 80
      filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Dest, value: gamma}]}}]
  - matches: [{path: {type: PathPrefix, value: /strip-prefix}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}]
    backendRefs: [{name: echo, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /full}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /one}}}]
    backendRefs: [{name: echo, port: 80}]
  - matches: [{path: {type: PathPrefix, value: /cors}}]
    filters: [{type: CORS, cors: {allowOrigins: ["https://*.example.com"], allowMethods: [GET, PUT], exposeHeaders: [X-Backend]}}]
    backendRefs: [{name: echo, port: 80}]
  - backendRefs: [{name: echo, port: 80}]
`)
	w.waitCode(t, "/original-prefix/lemon", nil, http.StatusFound)

	t.Run("HTTPRoute", func(t *testing.T) {
		redirects(t, "/original-prefix/lemon?x=1", http.StatusFound, "http://"+host+"/replacement-prefix/lemon?x=1")
		redirects(t, "/scheme/a", http.StatusMovedPermanently, "https://example.org/scheme/a")
		redirects(t, "/port", http.StatusTemporaryRedirect, "http://"+host+":8083/port")
		resp := reaches(t, "/prefix/one/two", "path=/one/two host=rewritten.example x-dest=gamma")
		if h := resp.Header; h.Get("X-Header-Set") != "set" || h.Get("X-Header-Add") != "added" || h.Get("X-Backend") != "" {
			t.Errorf("response headers %v, want X-Header-Set and X-Header-Add, no X-Backend", h)
		}
		reaches(t, "/strip-prefix/three", "path=/three host="+host+" x-dest=")
		reaches(t, "/strip-prefix", "path=/ host="+host+" x-dest=")
		reaches(t, "/full/one/two?q", "path=/one?q host="+host+" x-dest=")
		if resp := reaches(t, "/other", "path=/other host="+host+" x-dest="); resp.Header.Get("X-Backend") != "echo" {
			t.Errorf("a rule without filters changed the response: %v", resp.Header)
		}
		// CORS: the waypoint answers an allowed preflight; an allowed
		// request gets the CORS headers on the backend's response.
		pre, _ := http.NewRequest(http.MethodOptions, w.URL+"/cors", nil)
		pre.Header.Set("Origin", "https://app.example.com")
		pre.Header.Set("Access-Control-Request-Method", "PUT")
		if resp, err := w.hc.Do(pre); err != nil {
			t.Error(err)
		} else {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
				resp.Header.Get("Access-Control-Allow-Methods") != "GET,PUT" || resp.Header.Get("Access-Control-Max-Age") != "5" {
				t.Errorf("preflight = %d %v", resp.StatusCode, resp.Header)
			}
		}
		get, _ := http.NewRequest(http.MethodGet, w.URL+"/cors", nil)
		get.Header.Set("Origin", "https://app.example.com")
		if resp, err := w.hc.Do(get); err != nil {
			t.Error(err)
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.HasPrefix(string(b), "path=/cors ") || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" ||
				resp.Header.Get("Access-Control-Expose-Headers") != "X-Backend" {
				t.Errorf("CORS GET = %d %q %v", resp.StatusCode, b, resp.Header)
			}
		}
		if _, err := w.WP.WaitAccessLog(ctxT(t, 10*time.Second), func(a meshlab.AccessLog) bool {
			return a.Str("path") == "/scheme/a" && a.Str("code") == "301" && a.Str("route") == "rr/filters"
		}); err != nil {
			t.Error(err)
		}
	})

	if err := w.Remove("e2e-wp-redirect-httproute"); err != nil {
		t.Fatal(err)
	}
	apply(t, w.Mesh, "e2e-wp-redirect-vs", `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: rr}
spec:
  hosts: [echo]
  http:
  - match: [{uri: {exact: /old}}]
    redirect: {uri: /new, authority: example.org, redirectCode: 308}
  - match: [{uri: {prefix: /derive}}]
    redirect: {scheme: https, derivePort: FROM_PROTOCOL_DEFAULT}
  - match: [{uri: {prefix: /keep}}]
    redirect: {uri: /kept}
  - match: [{uri: {prefix: /api/}}]
    rewrite: {uri: /v2/, authority: api.example}
    headers: {response: {set: {x-vs: "1"}, remove: [x-backend]}}
    route: [{destination: {host: echo}, headers: {request: {set: {x-dest: vs}}}}]
  - match: [{uri: {prefix: /z2m/}}]
    rewrite: {uriRegexRewrite: {match: "^/z2m/(.*)$", rewrite: "/zig/\\1"}}
    route: [{destination: {host: echo}}]
  - match: [{uri: {exact: /teapot}}]
    directResponse: {status: 418, body: {string: short and stout}}
  - route: [{destination: {host: echo}}]
`)
	w.waitCode(t, "/teapot", nil, http.StatusTeapot)

	t.Run("VirtualService", func(t *testing.T) {
		redirects(t, "/old", http.StatusPermanentRedirect, "http://example.org/new")
		redirects(t, "/derive/x", http.StatusMovedPermanently, "https://"+host+"/derive/x")
		redirects(t, "/keep?a=b", http.StatusMovedPermanently, "http://"+host+"/kept?a=b")
		resp := reaches(t, "/api/items", "path=/v2/items host=api.example x-dest=vs")
		if resp.Header.Get("X-Vs") != "1" || resp.Header.Get("X-Backend") != "" {
			t.Errorf("response headers %v, want x-vs and no x-backend", resp.Header)
		}
		reaches(t, "/z2m/a/b", "path=/zig/a/b host="+host+" x-dest=")
		resp, body := do(t, "/teapot")
		if resp.StatusCode != http.StatusTeapot || body != "short and stout" {
			t.Errorf("GET /teapot = %d %q", resp.StatusCode, body)
		}
		reaches(t, "/plain", "path=/plain host="+host+" x-dest=")
	})
}
