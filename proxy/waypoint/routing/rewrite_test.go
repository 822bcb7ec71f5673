package routing

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TestReplacePrefixMatch is the table of Gateway API's HTTPPathModifier
// ReplacePrefixMatch documentation, and the paths of the conformance
// suite's HTTPRouteRewritePath and HTTPRouteRedirectPath (v1.6.3).
func TestReplacePrefixMatch(t *testing.T) {
	for _, tc := range []struct{ path, prefix, replace, want string }{
		// The API documentation's table.
		{"/foo/bar", "/foo", "/xyz", "/xyz/bar"},
		{"/foo/bar", "/foo", "/xyz/", "/xyz/bar"},
		{"/foo/bar", "/foo/", "/xyz", "/xyz/bar"},
		{"/foo/bar", "/foo/", "/xyz/", "/xyz/bar"},
		{"/foo", "/foo", "/xyz", "/xyz"},
		{"/foo/", "/foo", "/xyz", "/xyz/"},
		{"/foo/bar", "/foo", "", "/bar"},
		{"/foo/", "/foo", "", "/"},
		{"/foo", "/foo", "", "/"},
		{"/foo/", "/foo", "/", "/"},
		{"/foo", "/foo", "/", "/"},
		// HTTPRouteRewritePath.
		{"/prefix/one/two", "/prefix/one", "/one", "/one/two"},
		{"/strip-prefix/three", "/strip-prefix", "/", "/three"},
		{"/strip-prefix", "/strip-prefix", "/", "/"},
		{"/prefix/rewrite-path-and-modify-headers/one", "/prefix/rewrite-path-and-modify-headers", "/prefix", "/prefix/one"},
		// HTTPRouteRedirectPath.
		{"/original-prefix/lemon", "/original-prefix", "/replacement-prefix", "/replacement-prefix/lemon"},
		{"/path-and-host", "/path-and-host", "/replacement-prefix", "/replacement-prefix"},
		// The catch-all prefix "/".
		{"/foo", "/", "/xyz", "/xyz/foo"},
	} {
		n := len(strings.TrimSuffix(tc.prefix, "/"))
		if got := ReplacePrefixMatch(tc.path, n, tc.replace); got != tc.want {
			t.Errorf("%s with prefix %q replaced by %q: %q, want %q", tc.path, tc.prefix, tc.replace, got, tc.want)
		}
	}
}

func full(v string) *waypointapi.PathModifier {
	return &waypointapi.PathModifier{Type: waypointapi.PathModifier_FULL, Value: v}
}

func prefix(v string) *waypointapi.PathModifier {
	return &waypointapi.PathModifier{Type: waypointapi.PathModifier_PREFIX, Value: v}
}

// TestRedirectLocation: the Location and status of RequestRedirect as the
// mesh conformance tests HTTPRouteRedirectPath, -Port, -Scheme,
// -HostAndStatus, 303/307/308 and the gateway test
// HTTPRouteRedirectPortAndScheme (listeners on 80 and 8080) expect them,
// and Istio's redirect (port kept from the Host, derivePort, prefixRewrite).
func TestRedirectLocation(t *testing.T) {
	for _, tc := range []struct {
		name      string
		rd        *waypointapi.Redirect
		host      string // the request's Host
		target    string // its path and query
		prefix    string // the PathPrefix its match matched ("": not a prefix match)
		svcPort   uint16
		want      string
		wantCode  int
		istioLike bool
	}{
		{name: "prefix", rd: &waypointapi.Redirect{Path: prefix("/replacement-prefix")}, host: "echo", target: "/original-prefix/lemon", prefix: "/original-prefix",
			want: "http://echo/replacement-prefix/lemon"},
		{name: "full", rd: &waypointapi.Redirect{Path: full("/full-path-replacement")}, host: "echo", target: "/full/path/original", prefix: "/full",
			want: "http://echo/full-path-replacement"},
		{name: "path-and-host", rd: &waypointapi.Redirect{Host: "example.org", Path: prefix("/replacement-prefix")}, host: "echo", target: "/path-and-host", prefix: "/path-and-host",
			want: "http://example.org/replacement-prefix"},
		{name: "path-and-status", rd: &waypointapi.Redirect{Code: 301, Path: prefix("/replacement-prefix")}, host: "echo", target: "/path-and-status", prefix: "/path-and-status",
			want: "http://echo/replacement-prefix", wantCode: 301},
		{name: "full-path-and-host", rd: &waypointapi.Redirect{Host: "example.org", Path: full("/replacement-full")}, host: "echo", target: "/full-path-and-host", prefix: "/full-path-and-host",
			want: "http://example.org/replacement-full"},
		{name: "query kept", rd: &waypointapi.Redirect{Path: full("/new")}, host: "echo", target: "/old?a=1&b=2", prefix: "/old",
			want: "http://echo/new?a=1&b=2"},
		{name: "port", rd: &waypointapi.Redirect{Port: 8083}, host: "echo", target: "/port", prefix: "/port", want: "http://echo:8083/port"},
		{name: "port-and-host", rd: &waypointapi.Redirect{Port: 8083, Host: "example.org"}, host: "echo", target: "/port-and-host", prefix: "/port-and-host",
			want: "http://example.org:8083/port-and-host"},
		{name: "port-and-status", rd: &waypointapi.Redirect{Port: 8083, Code: 301}, host: "echo", target: "/port-and-status", prefix: "/port-and-status",
			want: "http://echo:8083/port-and-status", wantCode: 301},
		{name: "scheme", rd: &waypointapi.Redirect{Scheme: "https"}, host: "echo", target: "/scheme", prefix: "/scheme", want: "https://echo/scheme"},
		{name: "scheme-and-host", rd: &waypointapi.Redirect{Scheme: "https", Host: "example.org"}, host: "echo", target: "/scheme-and-host", prefix: "/scheme-and-host",
			want: "https://example.org/scheme-and-host"},
		{name: "host-and-status 301", rd: &waypointapi.Redirect{Host: "example.org", Code: 301}, host: "echo", target: "/hostname-redirect", prefix: "/hostname-redirect",
			want: "http://example.org/hostname-redirect", wantCode: 301},
		{name: "303", rd: &waypointapi.Redirect{Code: 303, Host: "example.org"}, host: "echo", target: "/", prefix: "/", want: "http://example.org/", wantCode: 303},
		{name: "307", rd: &waypointapi.Redirect{Code: 307, Host: "example.org"}, host: "echo", target: "/", prefix: "/", want: "http://example.org/", wantCode: 307},
		{name: "308", rd: &waypointapi.Redirect{Code: 308, Host: "example.org"}, host: "echo", target: "/", prefix: "/", want: "http://example.org/", wantCode: 308},
		// The Host's own port is not kept: the port is the listener's
		// (the addressed service port), left out when it is the scheme's.
		{name: "host port dropped", rd: &waypointapi.Redirect{Host: "example.org"}, host: "echo:80", target: "/x", prefix: "/x", want: "http://example.org/x"},
		// HTTPRouteRedirectPortAndScheme, listener (service port) 80.
		{name: "80 scheme-nil-port-nil", rd: &waypointapi.Redirect{Host: "example.org"}, host: "echo", target: "/a", svcPort: 80, want: "http://example.org/a"},
		{name: "80 scheme-nil-port-80", rd: &waypointapi.Redirect{Host: "example.org", Port: 80}, host: "echo", target: "/a", svcPort: 80, want: "http://example.org/a"},
		{name: "80 scheme-nil-port-8080", rd: &waypointapi.Redirect{Host: "example.org", Port: 8080}, host: "echo", target: "/a", svcPort: 80, want: "http://example.org:8080/a"},
		{name: "80 https-port-nil", rd: &waypointapi.Redirect{Host: "example.org", Scheme: "https"}, host: "echo", target: "/a", svcPort: 80, want: "https://example.org/a"},
		{name: "80 https-port-443", rd: &waypointapi.Redirect{Host: "example.org", Scheme: "https", Port: 443}, host: "echo", target: "/a", svcPort: 80, want: "https://example.org/a"},
		{name: "80 https-port-8443", rd: &waypointapi.Redirect{Host: "example.org", Scheme: "https", Port: 8443}, host: "echo", target: "/a", svcPort: 80, want: "https://example.org:8443/a"},
		// Listener (service port) 8080.
		{name: "8080 scheme-nil-port-nil", rd: &waypointapi.Redirect{Host: "example.org"}, host: "echo:8080", target: "/a", svcPort: 8080, want: "http://example.org:8080/a"},
		{name: "8080 scheme-nil-port-80", rd: &waypointapi.Redirect{Host: "example.org", Port: 80}, host: "echo:8080", target: "/a", svcPort: 8080, want: "http://example.org/a"},
		{name: "8080 https-port-nil", rd: &waypointapi.Redirect{Host: "example.org", Scheme: "https"}, host: "echo:8080", target: "/a", svcPort: 8080, want: "https://example.org/a"},
		// Istio: the Host's port is kept (Envoy), derivePort, prefixRewrite.
		{name: "istio keep", rd: &waypointapi.Redirect{Code: 301, PortRule: waypointapi.Redirect_KEEP, Path: full("/v2")}, host: "reviews:9080", target: "/v1?q", svcPort: 9080,
			want: "http://reviews:9080/v2?q", wantCode: 301},
		{name: "istio authority", rd: &waypointapi.Redirect{Code: 301, PortRule: waypointapi.Redirect_KEEP, Host: "ratings"}, host: "reviews:9080", target: "/x", svcPort: 9080,
			want: "http://ratings/x", wantCode: 301},
		{name: "istio FROM_PROTOCOL_DEFAULT", rd: &waypointapi.Redirect{Code: 302, PortRule: waypointapi.Redirect_PROTOCOL_DEFAULT, Scheme: "https"}, host: "reviews:9080", target: "/x", svcPort: 9080,
			want: "https://reviews/x", wantCode: 302},
		{name: "istio FROM_REQUEST_PORT", rd: &waypointapi.Redirect{Code: 302, PortRule: waypointapi.Redirect_REQUEST_PORT}, host: "reviews", target: "/x", svcPort: 9080,
			want: "http://reviews:9080/x", wantCode: 302},
		{name: "istio prefixRewrite", rd: &waypointapi.Redirect{Code: 301, PortRule: waypointapi.Redirect_KEEP, Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_STRING_PREFIX, Value: "/bar"}},
			host: "example.com", target: "/foo/baz", prefix: "/foo", want: "http://example.com/bar/baz", wantCode: 301, istioLike: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rd, ok := compileRedirect(tc.rd)
			if !ok {
				t.Fatal("does not compile")
			}
			u, _ := url.ParseRequestURI(tc.target)
			n := -1
			if tc.prefix != "" {
				n = len(strings.TrimSuffix(tc.prefix, "/"))
				if tc.istioLike {
					n = len(tc.prefix)
				}
			}
			port := tc.svcPort
			if port == 0 {
				port = 80
			}
			if got := rd.location(tc.host, u.Path, u.RawQuery, n, port); got != tc.want {
				t.Errorf("Location %q, want %q", got, tc.want)
			}
			want := tc.wantCode
			if want == 0 {
				want = 302
			}
			if rd.code != want {
				t.Errorf("status %d, want %d", rd.code, want)
			}
		})
	}
}

// TestEditRequest: the rule's and the backend's header modifiers and the
// URL rewrite, as HTTPRouteRewritePath, HTTPRouteRewriteHost and
// HTTPRouteRequestHeaderModifier expect; Istio's prefix and regex rewrites.
func TestEditRequest(t *testing.T) {
	mods := []*waypointapi.HeaderModifier{{
		Set:    map[string]string{"x-header-set": "set-overwrites-values"},
		Add:    map[string]string{"X-Header-Add": "header-val-1", "X-Header-Add-Append": "header-val-2"},
		Remove: []string{"x-header-remove"},
	}}
	for _, tc := range []struct {
		name           string
		match          *waypointapi.PathMatch
		rewrite        *waypointapi.Rewrite
		target, host   string
		wantURI, wantH string
	}{
		{name: "prefix", match: &waypointapi.PathMatch{Value: "/prefix/one"}, rewrite: &waypointapi.Rewrite{Path: prefix("/one")},
			target: "/prefix/one/two", wantURI: "/one/two"},
		{name: "strip", match: &waypointapi.PathMatch{Value: "/strip-prefix"}, rewrite: &waypointapi.Rewrite{Path: prefix("/")},
			target: "/strip-prefix", wantURI: "/"},
		{name: "strip query", match: &waypointapi.PathMatch{Value: "/strip-prefix"}, rewrite: &waypointapi.Rewrite{Path: prefix("/")},
			target: "/strip-prefix/three?x=1", wantURI: "/three?x=1"},
		{name: "full", match: &waypointapi.PathMatch{Value: "/full/one"}, rewrite: &waypointapi.Rewrite{Path: full("/one")},
			target: "/full/one/two", wantURI: "/one"},
		{name: "host", match: &waypointapi.PathMatch{Value: "/"}, rewrite: &waypointapi.Rewrite{Host: "one.example.org"},
			target: "/one", wantURI: "/one", wantH: "one.example.org"},
		{name: "host and path", match: &waypointapi.PathMatch{Value: "/"}, rewrite: &waypointapi.Rewrite{Host: "example.org", Path: full("/x")},
			target: "/one", wantURI: "/x", wantH: "example.org"},
		{name: "istio prefix", match: &waypointapi.PathMatch{Type: waypointapi.PathMatch_STRING_PREFIX, Value: "/ratings"},
			rewrite: &waypointapi.Rewrite{Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_STRING_PREFIX, Value: "/v1/bookRatings"}},
			target:  "/ratings/2", wantURI: "/v1/bookRatings/2"},
		{name: "istio prefix of exact match", match: &waypointapi.PathMatch{Type: waypointapi.PathMatch_EXACT, Value: "/ratings"},
			rewrite: &waypointapi.Rewrite{Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_STRING_PREFIX, Value: "/v1"}},
			target:  "/ratings", wantURI: "/v1"},
		{name: "istio regex", match: &waypointapi.PathMatch{Type: waypointapi.PathMatch_STRING_PREFIX, Value: "/z2m/"},
			rewrite: &waypointapi.Rewrite{Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_REGEX, Pattern: "/z2m(/|$)(.*)", Value: "/${2}"}},
			target:  "/z2m/a/b?c", wantURI: "/a/b?c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tab := Compile([]*waypointapi.Route{{Name: "r", Namespace: "ns", Rules: []*waypointapi.RouteRule{{
				Matches:                []*waypointapi.RouteMatch{{Path: tc.match}},
				RequestHeaderModifiers: mods,
				Rewrite:                tc.rewrite,
				Backends: []*waypointapi.Backend{{Hostname: "b", Weight: 1, RequestHeaderModifiers: []*waypointapi.HeaderModifier{{
					Set: map[string]string{"x-backend": "b"}}}}},
			}}}})
			r := httptest.NewRequest("GET", tc.target, nil)
			r.Host = "echo"
			r.Header.Set("X-Header-Set", "set-val")
			r.Header.Set("X-Header-Add-Append", "append-val-1")
			r.Header.Set("X-Header-Remove", "remove-val")
			rule, m, _ := tab.pick(r, Client{}, 80)
			if rule == nil {
				t.Fatal("no rule matched")
			}
			e := Edit{rule: rule, prefixLen: m.prefixLen, backend: &rule.backends[0]}
			e.Request(r, r.Header)
			if got := r.URL.RequestURI(); got != tc.wantURI {
				t.Errorf("request URI %q, want %q", got, tc.wantURI)
			}
			if r.RequestURI != tc.wantURI {
				t.Errorf("RequestURI field %q, want %q", r.RequestURI, tc.wantURI)
			}
			wantH := tc.wantH
			if wantH == "" {
				wantH = "echo"
			}
			if r.Host != wantH {
				t.Errorf("Host %q, want %q", r.Host, wantH)
			}
			h := r.Header
			if h.Get("X-Header-Set") != "set-overwrites-values" || h.Get("X-Header-Add") != "header-val-1" ||
				strings.Join(h.Values("X-Header-Add-Append"), ",") != "append-val-1,header-val-2" || h.Get("X-Header-Remove") != "" || h.Get("X-Backend") != "b" {
				t.Errorf("headers %v", h)
			}
		})
	}
}

// TestEditResponse: ResponseHeaderModifier (HTTPRouteResponseHeaderModifier):
// the backend's, then the rule's; names case-insensitive.
func TestEditResponse(t *testing.T) {
	tab := Compile([]*waypointapi.Route{{Name: "r", Namespace: "ns", Rules: []*waypointapi.RouteRule{{
		ResponseHeaderModifiers: []*waypointapi.HeaderModifier{{
			Set: map[string]string{"X-Header-Set": "set-overwrites-values"}, Add: map[string]string{"x-header-add": "header-val-1"},
			Remove: []string{"X-HEADER-REMOVE"}}},
		Backends: []*waypointapi.Backend{{Hostname: "b", Weight: 1, ResponseHeaderModifiers: []*waypointapi.HeaderModifier{{
			Set: map[string]string{"X-Header-Set": "backend", "X-Backend": "b"}}}}},
	}}}})
	rule := tab.rules[0]
	e := Edit{rule: rule, prefixLen: 0, backend: &rule.backends[0]}
	if !e.ModifiesResponse() {
		t.Fatal("ModifiesResponse false")
	}
	h := http.Header{"X-Header-Add": {"orig"}, "X-Header-Remove": {"x"}}
	e.Response(h)
	if h.Get("X-Header-Set") != "set-overwrites-values" || strings.Join(h.Values("X-Header-Add"), ",") != "orig,header-val-1" ||
		h.Get("X-Header-Remove") != "" || h.Get("X-Backend") != "b" {
		t.Errorf("headers %v", h)
	}
}

// TestAnswer: a redirect answers its status and Location, a direct
// response its status and body, each with the rule's response headers.
func TestAnswer(t *testing.T) {
	tab := Compile([]*waypointapi.Route{{Name: "r", Namespace: "ns", Kind: "VirtualService", Rules: []*waypointapi.RouteRule{
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_EXACT, Value: "/old"}}},
			Redirect:                &waypointapi.Redirect{Code: 301, PortRule: waypointapi.Redirect_KEEP, Path: full("/new")},
			ResponseHeaderModifiers: []*waypointapi.HeaderModifier{{Set: map[string]string{"x-r": "1"}}}},
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_EXACT, Value: "/teapot"}, Port: 80}},
			DirectResponse: &waypointapi.DirectResponse{Status: 418, Body: []byte("short and stout")}},
		{DirectResponse: &waypointapi.DirectResponse{Status: 204}},
	}}})
	for _, tc := range []struct {
		target           string
		port             uint16
		code             int
		location, body   string
		responseModified bool
	}{
		{target: "/old?x", port: 80, code: 301, location: "http://svc:8080/new?x", responseModified: true},
		{target: "/teapot", port: 80, code: 418, body: "short and stout"},
		{target: "/teapot", port: 81, code: 204}, // match.port
	} {
		r := httptest.NewRequest("GET", tc.target, nil)
		r.Host = "svc:8080"
		rule, m, _ := tab.pick(r, Client{}, tc.port)
		e := Edit{rule: rule, prefixLen: m.prefixLen}
		if !e.Answers() {
			t.Fatalf("%s: rule does not answer", tc.target)
		}
		rec := httptest.NewRecorder()
		if code := e.Answer(rec, r, tc.port); code != tc.code || rec.Code != tc.code {
			t.Errorf("%s: %d (recorded %d), want %d", tc.target, code, rec.Code, tc.code)
		}
		if got := rec.Header().Get("Location"); got != tc.location {
			t.Errorf("%s: Location %q, want %q", tc.target, got, tc.location)
		}
		if rec.Body.String() != tc.body {
			t.Errorf("%s: body %q, want %q", tc.target, rec.Body.String(), tc.body)
		}
		if (rec.Header().Get("X-R") != "") != tc.responseModified {
			t.Errorf("%s: response headers %v", tc.target, rec.Header())
		}
	}
}

// TestBrokenFilterAnswers500: a redirect status that is not one, or a
// rewrite regex that does not compile, leaves the rule without backends.
func TestBrokenFilterAnswers500(t *testing.T) {
	tab := Compile([]*waypointapi.Route{{Name: "r", Namespace: "ns", Rules: []*waypointapi.RouteRule{
		{Redirect: &waypointapi.Redirect{Code: 200}, Backends: []*waypointapi.Backend{{Hostname: "b", Weight: 1}}},
		{Rewrite: &waypointapi.Rewrite{Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_REGEX, Pattern: "("}},
			Backends: []*waypointapi.Backend{{Hostname: "b", Weight: 1}}},
	}}})
	for i, r := range tab.rules {
		if r.total != 0 || r.redirect != nil || r.rewrite != nil {
			t.Errorf("rule %d still routes", i)
		}
	}
}

// TestEditNoAllocs: picking a rule and applying an Edit that changes
// nothing (no filters: the common route) allocates nothing, and a
// prefix rewrite allocates only its new path.
func TestEditNoAllocs(t *testing.T) {
	tab := Compile([]*waypointapi.Route{{Name: "r", Namespace: "ns", Rules: []*waypointapi.RouteRule{
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Value: "/api"}}}, Backends: []*waypointapi.Backend{{Hostname: "b", Weight: 1}}},
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Value: "/old"}}}, Rewrite: &waypointapi.Rewrite{Path: prefix("/new")},
			Backends: []*waypointapi.Backend{{Hostname: "b", Weight: 1}}},
	}}})
	r := httptest.NewRequest("GET", "/api/x", nil)
	h := http.Header{"X-A": {"1"}}
	if n := testing.AllocsPerRun(100, func() {
		rule, m, _ := tab.pick(r, Client{}, 80)
		e := Edit{rule: rule, prefixLen: m.prefixLen}
		e.Request(r, h)
		if e.ModifiesResponse() || e.Answers() {
			t.Fatal("a rule without filters changes the response")
		}
	}); n != 0 {
		t.Errorf("%v allocations per request without filters, want 0", n)
	}
	rw := httptest.NewRequest("GET", "/old/x", nil)
	if n := testing.AllocsPerRun(100, func() {
		rw.URL.Path = "/old/x"
		rule, m, _ := tab.pick(rw, Client{}, 80)
		Edit{rule: rule, prefixLen: m.prefixLen}.Request(rw, rw.Header)
	}); n > 2 {
		t.Errorf("%v allocations per prefix rewrite, want at most 2 (the path, the request URI)", n)
	}
}
