package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

// dashboardsDir holds the Grafana dashboards the chart ships.
const dashboardsDir = "../deploy/chart/ztunnel-go/dashboards"

type grafanaDashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestDashboardQueries runs every panel query of the shipped Grafana
// dashboards against a real Prometheus (Debian's, from `make deps`) that
// scrapes the namespace cluster's node proxies and waypoint while traffic
// of every kind the panels show flows: allowed and denied connections, a
// dry-run policy, DNS answered and forwarded, waypoint requests (200, 403,
// 500) and an L4 connection through the waypoint. Each query must parse,
// and each panel must have data, so a renamed metric or label breaks here;
// the canonical service, security policy and waypoint TCP byte panels
// read the labels docs/telemetry.md lists.
func TestDashboardQueries(t *testing.T) {
	roottest.Require(t)
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: run make deps (Debian package prometheus)")
	}
	dashboards := loadDashboards(t)
	ctx := ctxT(t, 120*time.Second)
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "dash", Service: "web",
		Options:    meshlab.Options{Name: "dash", DNS: map[string]netip.Addr{"upstream.example.": netip.MustParseAddr("192.0.2.10")}},
		ExtraPorts: []kube.ServicePort{{Name: "tcp-echo", Port: 9000, TargetPort: 9000}},
		Containers: []kube.Container{{Name: "app", Ports: []kube.ContainerPort{{Name: "tcp-echo", Port: 9000}, {Name: "tcp-other", Port: 9001}}}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/fail" {
				w.WriteHeader(http.StatusInternalServerError)
			}
			fmt.Fprintf(w, "web %s", r.URL.Path)
		})})
	m, wp, web, client := w.Mesh, w.WP, w.Servers[0], w.Client
	apply(t, m, "e2e-dash-policies", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-other-port, namespace: dash}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{to: [{operation: {ports: ["9001"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: dry-deny-echo
  namespace: dash
  annotations: {istio.io/dry-run: "true"}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{to: [{operation: {ports: ["9000"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: dash}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: DENY
  rules: [{to: [{operation: {paths: ["/admin*"]}}]}]
`)

	prom := scrapeMesh(t, promBin, m, wp)

	// Traffic of every kind, for a few scrapes.
	vip := m.Service("dash", "web")
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return client.Dial(ctx, "tcp", netip.AddrPortFrom(vip, 80).String())
		}}}
	clusterDNS := netip.AddrPortFrom(m.DNSPod.IP, 53)
	traffic := func() {
		for _, path := range []string{"/", "/admin/x", "/fail"} {
			if resp, err := hc.Get("http://web.dash.svc.cluster.local" + path); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		meshlab.RoundTrip(tctx, client, netip.AddrPortFrom(vip, 9000), []byte("l4"))     // L4 through the waypoint
		meshlab.RoundTrip(tctx, client, netip.AddrPortFrom(web.IP, 9000), []byte("dry")) // the dry-run policy
		meshlab.RoundTrip(tctx, client, netip.AddrPortFrom(web.IP, 9001), []byte("no"))  // denied by deny-other-port
		meshlab.DNSQuery(tctx, client, "udp", clusterDNS, "web.dash.svc.cluster.local", dns.TypeA)
		meshlab.DNSQuery(tctx, client, "udp", clusterDNS, "upstream.example", dns.TypeA)
	}

	query := func(expr string) (promResult, error) { return promQuery(prom, expr) }
	// empty lists the panels without data yet; an unparsable query fails
	// at once.
	empty := func() []string {
		var out []string
		for file, d := range dashboards {
			for _, p := range d.Panels {
				rows := 0
				for _, tg := range p.Targets {
					expr := strings.ReplaceAll(tg.Expr, "$__rate_interval", "1m")
					r, err := query(expr)
					if err != nil {
						t.Fatalf("%s %q: query %s: %v", file, p.Title, expr, err)
					}
					if r.Status != "success" {
						t.Fatalf("%s %q: query %s: %s %s", file, p.Title, expr, r.Status, r.Error)
					}
					rows += len(r.Data.Result)
				}
				if rows == 0 {
					out = append(out, file+": "+p.Title)
				}
			}
		}
		return out
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		traffic()
		missing := empty()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("panels without data after a minute of traffic and scrapes:\n  %s", strings.Join(missing, "\n  "))
		}
		time.Sleep(time.Second)
	}
}

// scrapeMesh runs Prometheus scraping m's node proxies and the waypoint wp
// every second and returns its base URL.
func scrapeMesh(t *testing.T, promBin string, m *meshlab.Mesh, wp *meshlab.Waypoint) string {
	t.Helper()
	// Prometheus scrapes the node proxies and the waypoint through a relay
	// on the host's loopback: their stats ports are inside the cluster's
	// network namespaces. Each scrape fetches the live /metrics.
	relay := http.NewServeMux()
	relayFrom := func(fetch func(context.Context) (string, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			body, err := fetch(r.Context())
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			io.WriteString(w, body)
		}
	}
	for i := range m.Nodes {
		relay.Handle(fmt.Sprintf("/node%d", i), relayFrom(func(ctx context.Context) (string, error) {
			code, body, err := m.NodeHTTP(ctx, i, fmt.Sprintf("http://%s:%d/metrics", m.Nodes[i].UnderlayIP, meshlab.ProxyStatsPort))
			if err == nil && code != http.StatusOK {
				err = fmt.Errorf("status %d", code)
			}
			return string(body), err
		}))
	}
	relay.Handle("/waypoint", relayFrom(wp.Metrics))
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rs := &http.Server{Handler: relay, ReadHeaderTimeout: 5 * time.Second}
	go rs.Serve(rl)
	t.Cleanup(func() { rs.Close() })
	return startPrometheus(t, promBin, rl.Addr().String(), len(m.Nodes))
}

// promResult is an instant query's answer.
type promResult struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		Result []json.RawMessage `json:"result"`
	} `json:"data"`
}

// promQuery runs an instant query against the Prometheus at prom.
func promQuery(prom, expr string) (promResult, error) {
	var r promResult
	resp, err := http.Get(prom + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&r)
	return r, err
}

func loadDashboards(t *testing.T) map[string]grafanaDashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	if err != nil || len(files) < 2 {
		t.Fatalf("dashboards in %s: %v, %v; want the node proxy's and the waypoint's", dashboardsDir, files, err)
	}
	out := map[string]grafanaDashboard{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d grafanaDashboard
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if d.Title == "" || len(d.Panels) == 0 {
			t.Fatalf("%s: no title or no panels", f)
		}
		out[filepath.Base(f)] = d
	}
	return out
}

// startPrometheus runs Prometheus on the host's loopback, scraping the
// relay every second, and returns its base URL once it is ready.
func startPrometheus(t *testing.T, bin, relay string, nodes int) string {
	t.Helper()
	dir := t.TempDir()
	var cfg strings.Builder
	cfg.WriteString("global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\nscrape_configs:\n")
	for i := 0; i < nodes; i++ {
		// app: the node proxy pod's label, as Kubernetes service discovery
		// would attach it (Kiali's queries select ztunnel's series by it).
		fmt.Fprintf(&cfg, "- {job_name: node-proxy-%d, metrics_path: /node%d, static_configs: [{targets: [%q], labels: {instance: node%d, app: ztunnel}}]}\n", i, i, relay, i)
	}
	fmt.Fprintf(&cfg, "- {job_name: waypoint, metrics_path: /waypoint, static_configs: [{targets: [%q], labels: {instance: waypoint}}]}\n", relay)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready at %s: %v\n%s", base, err, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
