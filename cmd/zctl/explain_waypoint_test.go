package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// waypointDumpJSON is demo/waypoint's /config_dump as the waypoint serves
// it (protojson of its waypointapi.Config), with demo/reviews and
// shop/ratings bound (HTTP): demo/deny-admin DENY /admin* and
// demo/allow-client-get ALLOW sa-client GET /public* on reviews;
// shop/deny-ratings DENY /private* and shop/allow-get ALLOW GET on ratings.
func waypointDumpJSON(t *testing.T) []byte {
	t.Helper()
	prefix := func(v string) *waypointapi.StringMatch {
		return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Prefix{Prefix: v}}
	}
	exact := func(v string) *waypointapi.StringMatch {
		return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Exact{Exact: v}}
	}
	const reviews, ratings = "reviews.demo.svc.cluster.local", "ratings.shop.svc.cluster.local"
	c := &waypointapi.Config{
		Name: "waypoint", Namespace: "demo", Identity: "spiffe://cluster.local/ns/demo/sa/sa-waypoint", Addresses: [][]byte{{10, 96, 0, 40}},
		Services: []*waypointapi.Service{
			{Name: "reviews", Namespace: "demo", Hostname: reviews, Addresses: [][]byte{{10, 96, 0, 50}},
				Ports: []*waypointapi.Port{{Port: 9080, Name: "http", Protocol: waypointapi.Protocol_HTTP}}},
			{Name: "ratings", Namespace: "shop", Hostname: ratings, Addresses: [][]byte{{10, 96, 0, 60}},
				Ports: []*waypointapi.Port{{Port: 9080, Name: "http", Protocol: waypointapi.Protocol_HTTP}}},
		},
		Policies: []*waypointapi.Policy{
			{Name: "deny-admin", Namespace: "demo", Action: waypointapi.Action_DENY, Services: []string{reviews},
				Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{prefix("/admin")}}}}}},
			{Name: "allow-client-get", Namespace: "demo", Services: []string{reviews}, Rules: []*waypointapi.Rule{{
				From: []*waypointapi.Source{{Principals: []*waypointapi.StringMatch{exact("cluster.local/ns/demo/sa/sa-client")}}},
				To:   []*waypointapi.Operation{{Methods: []*waypointapi.StringMatch{exact("GET")}, Paths: []*waypointapi.StringMatch{prefix("/public")}}},
			}}},
			{Name: "deny-ratings", Namespace: "shop", Action: waypointapi.Action_DENY, Services: []string{ratings},
				Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{prefix("/private")}}}}}},
			{Name: "allow-get", Namespace: "shop", Services: []string{ratings},
				Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Methods: []*waypointapi.StringMatch{exact("GET")}}}}}},
		},
	}
	b, err := protojson.MarshalOptions{Multiline: true}.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestExplainWaypointL7(t *testing.T) {
	d := explainDump(t)
	wd, err := parseWaypointDump("file wp", waypointDumpJSON(t))
	if err != nil {
		t.Fatal(err)
	}
	first := func(int) int { return 0 }
	for _, tc := range []struct {
		name, src, dst, method, path string
		verdict, policy              string
		// want maps a step to substrings of its "result | by | detail";
		// indirect is the indirect flag's "direct/via" ("" for none).
		want     map[string][]string
		indirect string
	}{
		{name: "no request: the verdict depends on it", src: "demo/client", dst: "10.96.0.50:9080", verdict: verdictDepends, policy: "demo/allow-waypoint",
			want: map[string][]string{
				"waypoint":          {"demo/waypoint 10.0.5.1", "Gateway/demo/waypoint", "runs as spiffe://cluster.local/ns/demo/sa/sa-waypoint"},
				"waypoint policies": {"demo/deny-admin, demo/allow-client-get", "Service/demo/reviews port 9080 (HTTP)", "read from file wp"},
				"waypoint authz":    {"DEPENDS on the request", "AuthorizationPolicy/demo/deny-admin, AuthorizationPolicy/demo/allow-client-get", "give --method and --path", "sees spiffe://cluster.local/ns/demo/sa/sa-client (the client's, over mTLS) from 10.0.0.1"},
				"authz":             {"ALLOW", "AuthorizationPolicy/demo/allow-waypoint", "sees spiffe://cluster.local/ns/demo/sa/sa-waypoint (the waypoint's, over mTLS) from 10.0.5.1"},
			}},
		{name: "GET /public: allowed at the waypoint, and the indirect path flagged", src: "demo/client", dst: "reviews:9080", path: "/public/x", verdict: verdictAllow, policy: "demo/allow-waypoint",
			want: map[string][]string{
				"waypoint authz": {"ALLOW (explicitly allowed)", "AuthorizationPolicy/demo/allow-client-get", "GET /public/x host reviews, no request headers"},
				"authz":          {"AuthorizationPolicy/demo/allow-waypoint", "the waypoint's"},
				"indirect path": {"denied direct, allowed through the waypoint", "AuthorizationPolicy/demo/allow-client, AuthorizationPolicy/demo/allow-waypoint vs AuthorizationPolicy/demo/allow-client-get",
					"direct to 10.0.6.1:9080 as the client: no ALLOW policy matched (demo/allow-client, demo/allow-waypoint)", "waypoint: allowed by demo/allow-client-get"},
			}, indirect: "DENY/ALLOW"},
		{name: "DELETE /admin: denied at the waypoint, naming its policy", src: "demo/client", dst: "10.96.0.50:9080", method: "DELETE", path: "/admin/x", verdict: verdictDeny, policy: "demo/deny-admin",
			want: map[string][]string{
				"waypoint authz": {"DENY (denied by demo/deny-admin)", "AuthorizationPolicy/demo/deny-admin", "DELETE /admin/x"},
			}},
		{name: "POST /public: no waypoint ALLOW matches", src: "demo/client", dst: "10.96.0.50:9080", method: "POST", path: "/public", verdict: verdictDeny, policy: "",
			want: map[string][]string{
				"waypoint authz": {"DENY (no ALLOW policy matched (demo/allow-client-get))"},
			}},
		{name: "the pod IP directly: denied, allowed through the service's waypoint", src: "demo/client", dst: "10.0.6.1:9080", path: "/public", verdict: verdictDeny, policy: "",
			want: map[string][]string{
				"route":         {"hbone: CONNECT 10.0.6.1:9080"},
				"authz":         {"DENY (allow policies exist, but none allowed)"},
				"indirect path": {"denied direct, allowed through the waypoint", "AuthorizationPolicy/demo/allow-client, AuthorizationPolicy/demo/allow-waypoint vs AuthorizationPolicy/demo/allow-client-get", "through Gateway/demo/waypoint (for Service/demo/reviews)"},
			}, indirect: "DENY/ALLOW"},
		{name: "allowed by the waypoint's policy alone: the verdict names it", src: "demo/client", dst: "10.96.0.60:9080", path: "/ok", verdict: verdictAllow, policy: "shop/allow-get",
			want: map[string][]string{
				"waypoint authz": {"ALLOW (explicitly allowed)", "AuthorizationPolicy/shop/allow-get"},
				"authz":          {"ALLOW (no allow policies)", "the waypoint's"},
			}},
		{name: "denied through the waypoint, allowed direct (a bypass)", src: "demo/client", dst: "10.96.0.60:9080", path: "/private", verdict: verdictDeny, policy: "shop/deny-ratings",
			want: map[string][]string{
				"waypoint authz": {"DENY (denied by shop/deny-ratings)", "GET /private host ratings.shop.svc.cluster.local"},
				"indirect path":  {"allowed direct (bypassing the waypoint's policies), denied through the waypoint", "direct to 10.0.7.1:9080", "vs AuthorizationPolicy/shop/deny-ratings"},
			}, indirect: "ALLOW/DENY"},
		{name: "the ratings pod IP: allowed direct, the waypoint would deny", src: "demo/client", dst: "10.0.7.1:9080", path: "/private", verdict: verdictAllow,
			want: map[string][]string{
				"indirect path": {"allowed direct (bypassing the waypoint's policies)", "waypoint: denied by shop/deny-ratings"},
			}, indirect: "ALLOW/DENY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := explain(d, "file x", tc.src, tc.dst, &request{waypoints: []*waypointDump{wd}, method: tc.method, path: tc.path}, first)
			if err != nil {
				t.Fatal(err)
			}
			if e.Verdict != tc.verdict || e.Policy != tc.policy {
				t.Errorf("verdict %s by %q, want %s by %q: %+v", e.Verdict, e.Policy, tc.verdict, tc.policy, e.Steps)
			}
			for name, subs := range tc.want {
				s := stepOf(t, e, name)
				line := s.Result + " | " + s.By + " | " + s.Detail
				for _, sub := range subs {
					if !strings.Contains(line, sub) {
						t.Errorf("%s step %q lacks %q", name, line, sub)
					}
				}
			}
			got := ""
			if e.Indirect != nil {
				got = e.Indirect.Direct + "/" + e.Indirect.ViaWaypoint
			}
			if got != tc.indirect {
				t.Errorf("indirect %q, want %q: %+v", got, tc.indirect, e.Indirect)
			}
		})
	}
	// A waypoint config that is not this route's waypoint is not used.
	other, err := parseWaypointDump("file other", []byte(`{"name":"other","namespace":"x","identity":"spiffe://cluster.local/ns/x/sa/other"}`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := explain(d, "file x", "demo/client", "10.96.0.50:9080", &request{waypoints: []*waypointDump{other}}, first)
	if err != nil {
		t.Fatal(err)
	}
	if s := stepOf(t, e, "waypoint"); !strings.Contains(s.Detail, "none of the 1 given runs as spiffe://cluster.local/ns/demo/sa/sa-waypoint") {
		t.Errorf("waypoint step without its config: %+v", s)
	}
	if _, err := parseWaypointDump("file bad", []byte(`{"services":[{"ports":[{"port":70000}]}]}`)); err == nil {
		t.Error("a config the waypoint would refuse was accepted")
	}
}

// TestExplainWaypointFlags: --waypoint-admin reads the waypoint's
// /config_dump, --waypoint-file a saved one; exit codes 4 (depends) and 3.
func TestExplainWaypointFlags(t *testing.T) {
	b, err := json.Marshal(explainDump(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	node := filepath.Join(dir, "node.json")
	wpFile := filepath.Join(dir, "wp.json")
	wpJSON := waypointDumpJSON(t)
	if err := os.WriteFile(node, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wpFile, wpJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/config_dump" {
			http.NotFound(w, r)
			return
		}
		w.Write(wpJSON)
	}))
	defer srv.Close()
	wpAdmin := strings.TrimPrefix(srv.URL, "http://")

	var out bytes.Buffer
	err = run([]string{"explain", "-f", node, "--waypoint-admin", wpAdmin, "demo/client", "10.96.0.50:9080"}, &out, &out)
	if !errors.Is(err, errDepends) || !strings.Contains(out.String(), "DEPENDS on the request") {
		t.Errorf("without a request: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "Gateway/demo/waypoint admin http://"+wpAdmin+"/config_dump") {
		t.Errorf("the output does not say which waypoint it read:\n%s", out.String())
	}
	out.Reset()
	if err := run([]string{"explain", "-f", node, "--waypoint-file", wpFile, "--path", "/public", "-o", "json", "demo/client", "10.96.0.50:9080"}, &out, &out); err != nil {
		t.Fatalf("GET /public: %v\n%s", err, out.String())
	}
	var e explanation
	if err := json.Unmarshal(out.Bytes(), &e); err != nil {
		t.Fatal(err)
	}
	if e.Verdict != verdictAllow || e.Indirect == nil || e.Indirect.Direct != verdictDeny || e.Indirect.Waypoint != "Gateway/demo/waypoint" {
		t.Errorf("json: verdict %s indirect %+v", e.Verdict, e.Indirect)
	}
	out.Reset()
	if err := run([]string{"explain", "-f", node, "--waypoint-file", wpFile, "--method", "DELETE", "demo/client", "10.96.0.50:9080"}, &out, &out); !errors.Is(err, errDenied) {
		t.Errorf("DELETE /: %v\n%s", err, out.String())
	}
	if err := run([]string{"explain", "-f", node, "--waypoint-file", filepath.Join(dir, "missing"), "demo/client", "10.96.0.50:9080"}, &out, &out); err == nil {
		t.Error("a missing waypoint file was accepted")
	}
}
