package waypoint

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// BenchmarkFastPathRequest is bench/waypoint's request in process: a 1 KiB
// POST answered with 1 KiB on one keep-alive HBONE tunnel, through an
// ALLOW for the client's principal and POST under /api/*, a DENY of
// /admin* and an HTTPRoute that sets a header. The backend is a raw
// HTTP/1.1 responder on loopback; the client's side of the tunnel runs in
// the same process, so ns/op is both ends, and the waypoint's own share is
// what `-cpuprofile` and `-memprofile` focused on proxy/waypoint show.
func BenchmarkFastPathRequest(b *testing.B) {
	body := strings.Repeat("x", 1024)
	resp := "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1024\r\n\r\n" + body
	backend := rawBackend(b, func(*http.Request, []byte) (string, bool) { return resp, false })
	cfg := baseConfig(
		&waypointapi.Policy{Name: "allow-client", Namespace: "demo", Action: waypointapi.Action_ALLOW,
			Rules: []*waypointapi.Rule{{
				From: []*waypointapi.Source{{Principals: []*waypointapi.StringMatch{exact("cluster.local/ns/demo/sa/sa-client")}}},
				To: []*waypointapi.Operation{{Methods: []*waypointapi.StringMatch{exact("POST")},
					Paths: []*waypointapi.StringMatch{prefix("/api/")}}},
			}}},
		&waypointapi.Policy{Name: "deny-admin", Namespace: "demo", Action: waypointapi.Action_DENY,
			Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{prefix("/admin")}}}}}},
	)
	cfg.Services[0].Routes = []*waypointapi.Route{{Name: "api", Namespace: "demo", Rules: []*waypointapi.RouteRule{{
		Matches:                []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_PATH_PREFIX, Value: "/api"}, Method: "POST"}},
		RequestHeaderModifiers: []*waypointapi.HeaderModifier{{Set: map[string]string{"x-route": "api"}}},
		Backends:               []*waypointapi.Backend{{Hostname: proxytest.Hostname("demo", "server-v1"), Namespace: "demo", Port: 80, Weight: 1}},
	}}}}
	f := newFastLab(b, cfg, backend)
	// rawClient's tunnel, without its deadline (a run may take longer);
	// the body is discarded rather than read into a string (rawClient.do),
	// so that the client's side allocates as little as it can.
	rc := f.rawClient(b)
	if err := rc.c.SetDeadline(time.Time{}); err != nil {
		b.Fatal(err)
	}
	req := "POST /api/items HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: bench\r\nContent-Type: text/plain\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	post := &http.Request{Method: http.MethodPost}
	one := func() {
		if _, err := io.WriteString(rc.c, req); err != nil {
			b.Fatal(err)
		}
		r, err := http.ReadResponse(rc.br, post)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, r.Body)
		if r.StatusCode != 200 || n != 1024 || r.Header.Get("Content-Length") != "1024" {
			b.Fatalf("response %d with %d bytes, want 200 with 1024", r.StatusCode, n)
		}
	}
	one() // the upstream connection is dialled once, outside the timing
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		one()
	}
	b.StopTimer()
	if fb := f.w.fallbacks.Load(); fb != 0 {
		b.Errorf("%d tunnels fell back to net/http, want the fast path", fb)
	}
}
