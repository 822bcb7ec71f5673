package waypoint

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestRedirectRewriteFilters: on both paths (HTTP/1.1 fast path, h2c
// through net/http) a redirect rule answers its code and Location without
// going upstream, a rewrite reaches the backend with the new path and
// Host, response header modifiers change the backend's answer, and a
// direct response answers its status and body.
func TestRedirectRewriteFilters(t *testing.T) {
	cfg := baseConfig()
	backend := func() []*waypointapi.Backend {
		return []*waypointapi.Backend{{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Port: 80, Weight: 1,
			ResponseHeaderModifiers: []*waypointapi.HeaderModifier{{Set: map[string]string{"x-per-backend": "yes"}}}}}
	}
	cfg.Services[0].Routes = []*waypointapi.Route{{Name: "filters", Namespace: "demo", Rules: []*waypointapi.RouteRule{
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Value: "/original-prefix"}}},
			Redirect: &waypointapi.Redirect{Code: 301, Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_PREFIX, Value: "/replacement-prefix"}}},
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Value: "/scheme"}}},
			Redirect: &waypointapi.Redirect{Scheme: "https", Host: "example.org"}},
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Value: "/prefix/one"}}},
			Rewrite:                 &waypointapi.Rewrite{Host: "rewritten.example", Path: &waypointapi.PathModifier{Type: waypointapi.PathModifier_PREFIX, Value: "/one"}},
			ResponseHeaderModifiers: []*waypointapi.HeaderModifier{{Set: map[string]string{"X-Header-Set": "set"}, Add: map[string]string{"x-header-add": "added"}, Remove: []string{"X-BACKEND"}}},
			Backends:                backend()},
		{Matches: []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Value: "/teapot"}}},
			DirectResponse: &waypointapi.DirectResponse{Status: 418, Body: []byte("short and stout")}},
	}}}
	l := newLab(t, cfg)
	noFollow := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	h1c := l.client(clientID, clientIP)
	h1c.CheckRedirect = noFollow
	h2c := &http.Client{Timeout: 5 * time.Second, CheckRedirect: noFollow, Transport: &http2.Transport{AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
			return l.tunnel(ctx, clientID, clientIP, svcVIP+":80")
		}}}
	for _, c := range []struct {
		name string
		c    *http.Client
	}{{"http1", h1c}, {"h2c", h2c}} {
		t.Run(c.name, func(t *testing.T) {
			hits := l.hits[0].Load()
			req := func(path string) *http.Response {
				t.Helper()
				r, _ := http.NewRequest(http.MethodGet, "http://echo"+path, nil)
				resp, err := c.c.Do(r)
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				t.Cleanup(func() { resp.Body.Close() })
				return resp
			}
			if resp := req("/original-prefix/lemon?x=1"); resp.StatusCode != 301 || resp.Header.Get("Location") != "http://echo/replacement-prefix/lemon?x=1" {
				t.Errorf("prefix redirect %d %q", resp.StatusCode, resp.Header.Get("Location"))
			}
			if resp := req("/scheme"); resp.StatusCode != 302 || resp.Header.Get("Location") != "https://example.org/scheme" {
				t.Errorf("scheme redirect %d %q", resp.StatusCode, resp.Header.Get("Location"))
			}
			if l.hits[0].Load() != hits {
				t.Error("a redirect went upstream")
			}
			resp := req("/prefix/one/two")
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "v1 GET /one/two ") {
				t.Errorf("rewrite: %d %q, want the backend to see /one/two", resp.StatusCode, body)
			}
			if last := l.last[0].Load(); last == nil || !strings.HasPrefix(*last, "rewritten.example ") {
				t.Errorf("rewrite: backend saw Host %v, want rewritten.example", last)
			}
			if h := resp.Header; h.Get("X-Header-Set") != "set" || h.Get("X-Header-Add") != "added" || h.Get("X-Backend") != "" || h.Get("X-Per-Backend") != "yes" {
				t.Errorf("response headers %v", h)
			}
			resp = req("/teapot")
			body, _ = io.ReadAll(resp.Body)
			if resp.StatusCode != 418 || string(body) != "short and stout" {
				t.Errorf("direct response %d %q", resp.StatusCode, body)
			}
		})
	}
}
