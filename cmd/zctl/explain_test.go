package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/admin"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

const strictKey = "istio-system/istio_converted_static_strict"

// explainDump is a mesh dumped through the real admin Dumper:
//
//	demo/client   10.0.0.1 node0 HBONE
//	demo/other    10.0.0.2 node0 HBONE
//	demo/server   10.0.1.1 node1 HBONE, endpoint of demo/echo (VIP 10.96.0.10, 80→8080)
//	legacy/outsider 10.0.2.2 node0, not captured (plaintext)
//	secure/api    10.0.3.1 node1 HBONE, STRICT (the static strict policy), endpoint of secure/api (10.96.0.20, 443→8443)
//	local/cache   10.0.4.1 node1, endpoint of local/cache (10.96.0.30, 6379), internalTrafficPolicy Local
//	demo/waypoint 10.0.5.1 node1, endpoint of demo/waypoint (15008); waypoint of demo/reviews
//	demo/reviews-v1 10.0.6.1 node1, endpoint of demo/reviews (10.96.0.50, 9080), selected by demo/allow-waypoint
//	shop/ratings-v1 10.0.7.1 node1, endpoint of shop/ratings (10.96.0.60, 9080), waypoint demo/waypoint, no L4 policy
//	demo/remote-east no address, network east behind gateway istio-system/ew (172.16.0.1, network east),
//	                endpoint of demo/remote (10.96.0.70, 80→8080)
//	demo/old-echo   ExternalName alias of echo.demo.svc.cluster.local
//	egress/api      ServiceEntry api.example.com, auto-allocated 240.240.0.1:443, plaintext endpoint 192.0.2.10
//	policies: demo/allow-client ALLOW sa-client on 8080 (namespace); demo/deny-other DENY sa-other on 9090 (namespace);
//	          demo/allow-waypoint ALLOW sa-waypoint (selector); demo/dry-deny-client dry-run DENY sa-client on 8080;
//	          the static strict DENY
func explainDump(t *testing.T) *dump {
	t.Helper()
	s := state.NewStore()
	echo := proxytest.ServiceKey("demo", "echo")
	api := proxytest.ServiceKey("secure", "api")
	cache := proxytest.ServiceKey("local", "cache")
	wpSvc := proxytest.ServiceKey("demo", "waypoint")
	reviews := proxytest.ServiceKey("demo", "reviews")
	alias, err := anypb.New(wrapperspb.String("echo.demo.svc.cluster.local"))
	if err != nil {
		t.Fatal(err)
	}
	externalName := func(svc *workloadapi.Service) {
		svc.Extensions = []*workloadapi.Extension{{Name: state.ExternalNameAliasExtension, Config: alias}}
	}
	serviceEntry := func(svc *workloadapi.Service) { svc.Hostname = "api.example.com" }
	local := func(svc *workloadapi.Service) {
		svc.LoadBalancing = &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_STRICT,
			RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NODE}}
	}
	proxytest.Apply(t, s,
		proxytest.Pod("demo", "client", "10.0.0.1"),
		proxytest.Pod("demo", "other", "10.0.0.2"),
		proxytest.Pod("demo", "server", "10.0.1.1", proxytest.OnNode("node1"), proxytest.InService(echo, 80, 8080)),
		proxytest.Pod("legacy", "outsider", "10.0.2.2", proxytest.Plaintext()),
		proxytest.Pod("secure", "api", "10.0.3.1", proxytest.OnNode("node1"), proxytest.InService(api, 443, 8443), proxytest.Policies(strictKey)),
		proxytest.Pod("local", "cache", "10.0.4.1", proxytest.OnNode("node1"), proxytest.InService(cache, 6379, 6379)),
		proxytest.Pod("demo", "waypoint", "10.0.5.1", proxytest.OnNode("node1"), proxytest.InService(wpSvc, 15008, 15008)),
		proxytest.Pod("demo", "reviews-v1", "10.0.6.1", proxytest.OnNode("node1"), proxytest.InService(reviews, 9080, 9080),
			proxytest.Policies("demo/allow-waypoint")),
		proxytest.Service("demo", "echo", "10.96.0.10", []uint32{80, 8080}),
		proxytest.Service("demo", "old-echo", "", nil, externalName),
		proxytest.Service("egress", "api", "240.240.0.1", []uint32{443, 443}, serviceEntry),
		proxytest.Pod("egress", "api-ext", "192.0.2.10", proxytest.Plaintext(), proxytest.InService("egress/api.example.com", 443, 443)),
		proxytest.Service("secure", "api", "10.96.0.20", []uint32{443, 8443}),
		proxytest.Service("local", "cache", "10.96.0.30", []uint32{6379, 6379}, local),
		proxytest.Service("demo", "waypoint", "10.96.0.40", []uint32{15008, 15008}),
		proxytest.Service("demo", "reviews", "10.96.0.50", []uint32{9080, 9080}, proxytest.ServiceWaypoint(proxytest.WaypointHost("demo", "waypoint"))),
		proxytest.Pod("shop", "ratings-v1", "10.0.7.1", proxytest.OnNode("node1"), proxytest.InService(proxytest.ServiceKey("shop", "ratings"), 9080, 9080)),
		proxytest.Service("shop", "ratings", "10.96.0.60", []uint32{9080, 9080}, proxytest.ServiceWaypoint(proxytest.WaypointHost("demo", "waypoint"))),
		proxytest.Pod("demo", "remote-east", "", proxytest.Network("east"), proxytest.NetworkGateway(proxytest.GatewayIP("east", "172.16.0.1", 15008)),
			proxytest.InService(proxytest.ServiceKey("demo", "remote"), 80, 8080)),
		proxytest.Pod("istio-system", "ew", "172.16.0.1", proxytest.Network("east"), proxytest.ServiceAccount("sa-ew")),
		proxytest.Service("demo", "remote", "10.96.0.70", []uint32{80, 8080}),
	)
	allowWP := proxytest.Policy("demo", "allow-waypoint", securityapi.Action_ALLOW, proxytest.Rule(proxytest.Principals("cluster.local/ns/demo/sa/sa-waypoint")))
	allowWP.Scope = securityapi.Scope_WORKLOAD_SELECTOR
	dryDeny := proxytest.Policy("demo", "dry-deny-client", securityapi.Action_DENY,
		proxytest.Rule(proxytest.Principals("cluster.local/ns/demo/sa/sa-client"), proxytest.Ports(8080)))
	dryDeny.DryRun = true
	proxytest.ApplyPolicies(t, s,
		proxytest.Policy("demo", "allow-client", securityapi.Action_ALLOW,
			proxytest.Rule(proxytest.Principals("cluster.local/ns/demo/sa/sa-client"), proxytest.Ports(8080))),
		proxytest.Policy("demo", "deny-other", securityapi.Action_DENY,
			proxytest.Rule(proxytest.Principals("cluster.local/ns/nobody/sa/x")),
			proxytest.Rule(proxytest.Principals("cluster.local/ns/demo/sa/sa-other"), proxytest.Ports(9090))),
		allowWP, dryDeny,
		proxytest.StrictPolicy("istio-system"),
	)
	b, err := json.Marshal((&admin.Dumper{State: s}).Build())
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDump(b)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// stepOf returns the named step, or fails.
func stepOf(t *testing.T, e *explanation, name string) step {
	t.Helper()
	for _, s := range e.Steps {
		if s.Step == name {
			return s
		}
	}
	t.Fatalf("no %s step in %+v", name, e.Steps)
	return step{}
}

func TestExplain(t *testing.T) {
	d := explainDump(t)
	first := func(int) int { return 0 }
	for _, tc := range []struct {
		name, src, dst string
		verdict        string
		policy         string
		rule           int // -1: none
		// want maps a step to substrings of its "result | by | detail".
		want map[string][]string
	}{
		{"ALLOW naming the policy and rule", "demo/client", "10.96.0.10:80", verdictAllow, "demo/allow-client", 0, map[string][]string{
			"capture":  {"on: outbound captured by the node proxy on node0", "Workload/demo/client"},
			"route":    {"hbone: CONNECT 10.0.1.1:8080 to 10.0.1.1:15008", "Service/demo/echo", "peer must be spiffe://cluster.local/ns/demo/sa/sa-server"},
			"endpoint": {"demo/server 10.0.1.1:8080", "load balancing default"},
			"dry-run":  {"would deny", "AuthorizationPolicy/demo/dry-deny-client"},
			"authz":    {"ALLOW (explicitly allowed)", "AuthorizationPolicy/demo/allow-client", "rule 0", "sees spiffe://cluster.local/ns/demo/sa/sa-client (the client's, over mTLS) from 10.0.0.1"},
		}},
		{"DENY naming the policy and rule", "demo/other", "10.0.1.1:9090", verdictDeny, "demo/deny-other", 1, map[string][]string{
			"route": {"hbone: CONNECT 10.0.1.1:9090 to 10.0.1.1:15008", "Workload/demo/server"},
			"authz": {"DENY (explicitly denied)", "AuthorizationPolicy/demo/deny-other", "rule 1", "sees spiffe://cluster.local/ns/demo/sa/sa-other"},
		}},
		{"DENY by no matching ALLOW names no policy", "demo/other", "10.96.0.10:80", verdictDeny, "", -1, map[string][]string{
			"authz":    {"DENY (allow policies exist, but none allowed)"},
			"policies": {"demo/allow-client, demo/deny-other"},
		}},
		{"STRICT with a plaintext source", "legacy/outsider", "10.96.0.20:443", verdictDeny, strictKey, 0, map[string][]string{
			"capture":  {"off: NONE workload", "Workload/legacy/outsider", "no identity"},
			"endpoint": {"secure/api 10.0.3.1:8443", "Service/secure/api"},
			"policies": {strictKey},
			"authz":    {"DENY (explicitly denied)", "AuthorizationPolicy/" + strictKey, "sees no identity (plaintext on the inbound port) from 10.0.2.2"},
		}},
		{"STRICT with a mesh source", "demo/client", "10.96.0.20:443", verdictAllow, "", -1, map[string][]string{
			"authz": {"ALLOW (no allow policies)", "sees spiffe://cluster.local/ns/demo/sa/sa-client"},
		}},
		{"internalTrafficPolicy Local refuses a client on another node", "demo/client", "10.96.0.30:6379", verdictRefused, "", -1, map[string][]string{
			"route": {"refused at the source node proxy", "Service/local/cache", "no healthy upstream", "STRICT on NODE (internalTrafficPolicy: Local)"},
		}},
		{"waypoint route", "demo/client", "10.96.0.50:9080", verdictAllow, "demo/allow-waypoint", 0, map[string][]string{
			"route":    {"waypoint: HBONE CONNECT 10.96.0.50:9080 to 10.0.5.1:15008", "Service/demo/reviews", "spiffe://cluster.local/ns/demo/sa/sa-waypoint"},
			"waypoint": {"demo/waypoint 10.0.5.1", "Workload/demo/waypoint"},
			"endpoint": {"demo/reviews-v1 10.0.6.1:9080", "Service/demo/reviews"},
			"authz":    {"AuthorizationPolicy/demo/allow-waypoint", "sees spiffe://cluster.local/ns/demo/sa/sa-waypoint (the waypoint's, over mTLS) from 10.0.5.1"},
		}},
		{"DNS: a Service by its short name", "demo/client", "echo:80", verdictAllow, "demo/allow-client", 0, map[string][]string{
			"dns":   {"A echo → 10.96.0.10", "Service/demo/echo", "answered by the pod's DNS proxy"},
			"route": {"hbone: CONNECT 10.0.1.1:8080"},
		}},
		{"DNS: an ExternalName alias followed to its target", "demo/client", "old-echo.demo.svc.cluster.local:80", verdictAllow, "demo/allow-client", 0, map[string][]string{
			"dns": {"A old-echo.demo.svc.cluster.local → 10.96.0.10", "Service/demo/echo", "CNAME old-echo.demo.svc.cluster.local → echo.demo.svc.cluster.local"},
		}},
		{"DNS: a ServiceEntry's allocated address", "demo/client", "api.example.com:443", verdictAllow, "", -1, map[string][]string{
			"dns":   {"A api.example.com → 240.240.0.1", "ServiceEntry/egress/api", "the ServiceEntry's address"},
			"route": {"direct: plain TCP to 192.0.2.10:443", "Service/egress/api"},
		}},
		{"another network, through its gateway", "demo/client", "10.96.0.70:80", verdictRemote, "", -1, map[string][]string{
			"route": {"double-hbone: CONNECT remote.demo.svc.cluster.local:80 to network gateway 172.16.0.1:15008", "Service/demo/remote",
				"Workload/istio-system/ew must be spiffe://cluster.local/ns/istio-system/sa/sa-ew"},
			"endpoint": {"demo/remote-east on network east", "peer must be spiffe://cluster.local/ns/demo/sa/sa-remote-east"},
			"authz":    {"on the other network"},
		}},
		{"outside the mesh", "demo/client", "192.0.2.1:443", verdictAllow, "", -1, map[string][]string{
			"route": {"passthrough: plain TCP to 192.0.2.1:443"},
		}},
		{"recursive call refused", "demo/client", "127.0.0.1:15001", verdictRefused, "", -1, map[string][]string{
			"route": {"refused at the source node proxy", "recursive call"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := explain(d, "file x", tc.src, tc.dst, nil, first)
			if err != nil {
				t.Fatal(err)
			}
			if e.Verdict != tc.verdict || e.Policy != tc.policy {
				t.Errorf("verdict %s by %q, want %s by %q: %+v", e.Verdict, e.Policy, tc.verdict, tc.policy, e.Steps)
			}
			if gotRule := -1; (e.Rule != nil && *e.Rule != tc.rule) || (e.Rule == nil && tc.rule != gotRule) {
				t.Errorf("rule %v, want %d", e.Rule, tc.rule)
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
		})
	}
	for _, bad := range [][2]string{{"demo/nobody", "10.96.0.10:80"}, {"demo/client", "example.org:443"}, {"demo/client", "echo"}} {
		if _, err := explain(d, "file x", bad[0], bad[1], nil, first); err == nil {
			t.Errorf("%s → %s accepted", bad[0], bad[1])
		}
	}
}

// TestExplainFormats: table, JSON and YAML carry the same content.
func TestExplainFormats(t *testing.T) {
	e, err := explain(explainDump(t), "file x", "legacy/outsider", "10.96.0.20:443", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var tbl, js, ym bytes.Buffer
	for f, b := range map[string]*bytes.Buffer{"": &tbl, "json": &js, "yaml": &ym} {
		if err := writeExplanation(b, e, f); err != nil {
			t.Fatal(err)
		}
	}
	var fromJSON, fromYAML explanation
	if err := json.Unmarshal(js.Bytes(), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(ym.Bytes(), &fromYAML); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(fromJSON)
	b, _ := json.Marshal(fromYAML)
	if want, _ := json.Marshal(e); string(a) != string(want) || string(b) != string(want) {
		t.Errorf("formats differ:\njson %s\nyaml %s\nwant %s", a, b, want)
	}
	for _, s := range e.Steps {
		if !strings.Contains(tbl.String(), s.Result) {
			t.Errorf("table lacks %q:\n%s", s.Result, tbl.String())
		}
	}
	if !strings.Contains(strings.Join(strings.Fields(tbl.String()), " "), "verdict DENY AuthorizationPolicy/"+strictKey+" rule 0") {
		t.Errorf("table verdict line:\n%s", tbl.String())
	}
	if err := writeExplanation(&bytes.Buffer{}, e, "xml"); err == nil {
		t.Error("unknown format accepted")
	}
}

// TestUsageContactsNothing: zctl, -h and <command> -h print usage, succeed
// (exit 0) and never dial the admin address.
func TestUsageContactsNothing(t *testing.T) {
	admin, dialled := countDials(t)
	for _, args := range [][]string{
		nil, {"-h"}, {"--help"}, {"help"},
		{"explain", "-h"}, {"check", "--admin", admin, "-h"}, {"config-dump", "-h", "--admin", admin}, {"explain", "--admin", admin, "demo/a", "-h"},
	} {
		var out, errOut bytes.Buffer
		err := run(args, &out, &errOut)
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%q: %v", args, err)
		}
		if !strings.Contains(out.String(), "usage: zctl") {
			t.Errorf("%q printed no usage on stdout: %q", args, out.String())
		}
	}
	if n := dialled.Load(); n != 0 {
		t.Errorf("usage dialled the admin address %d times", n)
	}
	// A real command does dial it (the listener works).
	if err := run([]string{"config-dump", "--admin", admin}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Error("config-dump against a closing listener succeeded")
	}
	if n := dialled.Load(); n == 0 {
		t.Error("config-dump did not dial the admin address")
	}
}

// TestExplainRunJSON: the command line's -o json on a saved dump.
func TestExplainRunJSON(t *testing.T) {
	d := explainDump(t)
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "dump.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{"explain", "-f", p, "-o", "json", "demo/client", "10.96.0.30:6379"}, &out, &out); !errors.Is(err, errDenied) {
		t.Fatalf("explain = %v, want errDenied\n%s", err, out.String())
	}
	var e explanation
	if err := json.Unmarshal(out.Bytes(), &e); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if e.Verdict != verdictRefused || e.Proxy != "file "+p {
		t.Errorf("verdict %s from %q", e.Verdict, e.Proxy)
	}
}

// TestExplainLiveAdmin: --admin fetches /config_dump and names the proxy.
func TestExplainLiveAdmin(t *testing.T) {
	b, err := json.Marshal(explainDump(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/config_dump" {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	var out bytes.Buffer
	if err := run([]string{"explain", "--admin", addr, "-o", "yaml", "demo/client", "echo:80"}, &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var e explanation
	if err := yaml.Unmarshal(out.Bytes(), &e); err != nil {
		t.Fatal(err)
	}
	if e.Proxy != "admin http://"+addr+"/config_dump" || e.Verdict != verdictAllow || e.Policy != "demo/allow-client" {
		t.Errorf("got proxy %q verdict %s policy %q", e.Proxy, e.Verdict, e.Policy)
	}
}
