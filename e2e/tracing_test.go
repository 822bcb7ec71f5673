package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// otelcolBinary is the test collector (hack/otelcol): $ZTG_OTELCOL (make
// e2e builds it), else the one hack/otelcol/build.sh has cached.
func otelcolBinary(t *testing.T) string {
	if b := os.Getenv("ZTG_OTELCOL"); b != "" {
		return b
	}
	out, err := exec.Command("../hack/otelcol/build.sh", "-n").Output()
	if err != nil {
		t.Fatalf("the test collector is not built: run hack/otelcol/build.sh (make e2e does) or set ZTG_OTELCOL (%v)", err)
	}
	return strings.TrimSpace(string(out))
}

// collector is a real OpenTelemetry Collector in the test cluster: OTLP
// gRPC on 4317 and HTTP on 4318 of ip, every batch appended to a file as
// OTLP JSON.
type collector struct {
	ip   netip.Addr
	file string
}

// startCollector runs the collector in a pod of its own.
func startCollector(t *testing.T, ctx context.Context, m *meshlab.Mesh) *collector {
	t.Helper()
	if err := m.AddNamespace("otel", nil); err != nil { // not ambient: the waypoint reaches it in plain TCP
		t.Fatal(err)
	}
	pod, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: "otelcol", Namespace: "otel"})
	if err != nil {
		t.Fatal(err)
	}
	return runCollector(t, ctx, pod.NetNS, pod.IP)
}

// runCollector runs the collector in ns, whose address is ip.
func runCollector(t *testing.T, ctx context.Context, ns *testcluster.NetNS, ip netip.Addr) *collector {
	t.Helper()
	dir := t.TempDir()
	c := &collector{ip: ip, file: filepath.Join(dir, "spans.jsonl")}
	cfg := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc: {endpoint: "0.0.0.0:4317"}
      http: {endpoint: "0.0.0.0:4318"}
exporters:
  spanfile: {path: %q}
service:
  telemetry:
    metrics: {level: none}
  pipelines:
    traces: {receivers: [otlp], exporters: [spanfile]}
    logs: {receivers: [otlp], exporters: [spanfile]}
`, c.file)
	cfgPath := filepath.Join(dir, "otelcol.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	proc, err := ns.Start(testcluster.Process{Name: "otelcol", Path: otelcolBinary(t), Args: []string{"--config", "file:" + cfgPath}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proc.Stop() })
	for _, port := range []string{"4317", "4318"} {
		for {
			conn, err := ns.Dial(ctx, "tcp", "127.0.0.1:"+port)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-proc.Done():
				t.Fatalf("collector exited: %v\n%s", proc.Err(), proc.Log())
			case <-ctx.Done():
				t.Fatalf("collector not listening on %s: %v\n%s", port, err, proc.Log())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return c
}

// otlpSpan is one span of the collector's OTLP JSON.
type otlpSpan struct {
	TraceID      string `json:"traceId"`
	SpanID       string `json:"spanId"`
	ParentSpanID string `json:"parentSpanId"`
	Name         string `json:"name"`
	Kind         int    `json:"kind"`
	Attributes   []struct {
		Key   string `json:"key"`
		Value struct {
			StringValue string `json:"stringValue"`
		} `json:"value"`
	} `json:"attributes"`
}

func (s otlpSpan) attr(k string) string {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value.StringValue
		}
	}
	return ""
}

// spans reads every span the collector has written.
func (c *collector) spans(t *testing.T) []otlpSpan {
	var out []otlpSpan
	c.batches(t, func(line []byte) {
		var batch struct {
			ResourceSpans []struct {
				ScopeSpans []struct {
					Spans []otlpSpan `json:"spans"`
				} `json:"scopeSpans"`
			} `json:"resourceSpans"`
		}
		if json.Unmarshal(line, &batch) != nil {
			return
		}
		for _, rs := range batch.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				out = append(out, ss.Spans...)
			}
		}
	})
	return out
}

// batches calls fn with each batch (a line of OTLP JSON) the collector
// has written so far.
func (c *collector) batches(t *testing.T, fn func(line []byte)) {
	b, err := os.ReadFile(c.file)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		fn(sc.Bytes())
	}
}

// otlpLog is one log record of the collector's OTLP JSON, with its logger
// (the scope's name).
type otlpLog struct {
	Scope string
	Body  string
	Attrs map[string]string
}

// logs reads every log record the collector has written.
func (c *collector) logs(t *testing.T) []otlpLog {
	type anyValue struct {
		StringValue string `json:"stringValue"`
	}
	var out []otlpLog
	c.batches(t, func(line []byte) {
		var batch struct {
			ResourceLogs []struct {
				ScopeLogs []struct {
					Scope struct {
						Name string `json:"name"`
					} `json:"scope"`
					LogRecords []struct {
						Body       anyValue `json:"body"`
						Attributes []struct {
							Key   string   `json:"key"`
							Value anyValue `json:"value"`
						} `json:"attributes"`
					} `json:"logRecords"`
				} `json:"scopeLogs"`
			} `json:"resourceLogs"`
		}
		if json.Unmarshal(line, &batch) != nil {
			return
		}
		for _, rl := range batch.ResourceLogs {
			for _, sl := range rl.ScopeLogs {
				for _, r := range sl.LogRecords {
					l := otlpLog{Scope: sl.Scope.Name, Body: r.Body.StringValue, Attrs: map[string]string{}}
					for _, a := range r.Attributes {
						l.Attrs[a.Key] = a.Value.StringValue
					}
					out = append(out, l)
				}
			}
		}
	})
	return out
}

// waitSpan polls until a span of trace tid arrives.
func (c *collector) waitSpan(t *testing.T, ctx context.Context, tid string) otlpSpan {
	t.Helper()
	for {
		for _, s := range c.spans(t) {
			if s.TraceID == tid {
				return s
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no span of trace %s at the collector (%d spans)", tid, len(c.spans(t)))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestTelemetryTracing: client → waypoint → server with a real collector.
// A request sent with a sampled traceparent produces at the collector the
// waypoint's span (kind server) whose parent is the client's span, and the
// server receives a traceparent whose parent is that span, and an
// x-request-id the span names. With sampling 0% (OTLP/HTTP this time) a
// new trace produces no span, while a request that arrives sampled still
// does (Envoy keeps the upstream's decision).
func TestTelemetryTracing(t *testing.T) {
	const ns = "tracing"
	ctx := ctxT(t, 150*time.Second)
	var mu sync.Mutex
	var seen []http.Header
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: ns, Service: "web", Options: meshlab.Options{Name: "tracing"},
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen = append(seen, r.Header.Clone())
			mu.Unlock()
			fmt.Fprint(rw, "web")
		})})
	last := func() http.Header {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			t.Fatal("the server saw no request")
		}
		return seen[len(seen)-1]
	}
	col := startCollector(t, ctx, w.Mesh)
	restart := func(args ...string) {
		t.Helper()
		if err := w.WP.Close(); err != nil {
			t.Logf("stopping the waypoint: %v", err)
		}
		wp, err := w.Mesh.StartWaypointArgs(ctx, "demo", "waypoint", args...)
		if err != nil {
			t.Fatal(err)
		}
		w.WP = wp
	}
	restart("--tracing-endpoint", col.ip.String()+":4317", "--tracing-protocol", "grpc", "--tracing-sampling", "100")

	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	if code, body := w.do(t, "/traced", http.Header{"Traceparent": {"00-" + clientTrace + "-" + clientSpan + "-01"}}); code != http.StatusOK {
		t.Fatalf("traced request: %d %s", code, body)
	}
	got := last()
	sp := col.waitSpan(t, ctx, clientTrace)
	if sp.ParentSpanID != clientSpan || sp.Kind != 2 {
		t.Errorf("waypoint span: parent %q kind %d, want the client's span %s and kind server (2)", sp.ParentSpanID, sp.Kind, clientSpan)
	}
	if want := "00-" + clientTrace + "-" + sp.SpanID + "-01"; got.Get("traceparent") != want {
		t.Errorf("server's traceparent %q, want %q (its parent the waypoint's span)", got.Get("traceparent"), want)
	}
	rid := got.Get("x-request-id")
	if rid == "" || sp.attr("guid:x-request-id") != rid {
		t.Errorf("server's x-request-id %q, the span's %q", rid, sp.attr("guid:x-request-id"))
	}
	for k, v := range map[string]string{"http.method": "GET", "http.status_code": "200", "istio.canonical_service": "waypoint",
		"upstream_cluster": "inbound-vip|80|http|web." + ns + ".svc.cluster.local"} {
		if sp.attr(k) != v {
			t.Errorf("span attribute %s = %q, want %q", k, sp.attr(k), v)
		}
	}
	t.Logf("waypoint span %s %q parent %s, server traceparent %s, x-request-id %s", sp.SpanID, sp.Name, sp.ParentSpanID,
		got.Get("traceparent"), rid)

	// Sampling 0%, OTLP/HTTP.
	restart("--tracing-endpoint", col.ip.String()+":4318", "--tracing-protocol", "http", "--tracing-sampling", "0")
	if code, _ := w.do(t, "/unsampled", nil); code != http.StatusOK {
		t.Fatalf("unsampled request: %d", code)
	}
	tp := strings.Split(last().Get("traceparent"), "-")
	if len(tp) != 4 || tp[3] != "00" {
		t.Fatalf("server's traceparent %q at 0%%, want an unsampled one", last().Get("traceparent"))
	}
	if rid := last().Get("x-request-id"); rid == "" {
		t.Error("no x-request-id reached the server at 0%")
	}
	const sampledTrace = "5bf92f3577b34da6a3ce929d0e0e4736"
	if code, _ := w.do(t, "/sampled-upstream", http.Header{"Traceparent": {"00-" + sampledTrace + "-" + clientSpan + "-01"}}); code != http.StatusOK {
		t.Fatalf("request sampled upstream: %d", code)
	}
	col.waitSpan(t, ctx, sampledTrace) // exported after the unsampled one would have been
	for _, s := range col.spans(t) {
		if s.TraceID == tp[1] {
			t.Errorf("sampling 0%%: the new trace %s produced a span", tp[1])
		}
	}
}

// TestNodeProxyTracing: node proxies with TRACING_ENDPOINT send one span
// per connection to a real collector (in node1's namespace, at its
// underlay address, known before the mesh starts). A connection from a
// client pod on node0 to a server pod on node1 is node0's outbound span
// (kind client) and node1's inbound span (kind server), one trace, the
// inbound span the outbound one's child through the CONNECT's traceparent,
// each naming the workloads and mutual TLS.
func TestNodeProxyTracing(t *testing.T) {
	roottest.Require(t)
	const ns = "nodetrace"
	colAddr := netip.AddrPortFrom(testcluster.NodeUnderlayIP(1), 4317)
	m, err := meshlab.Start(t, meshlab.Options{Name: ns, ProxyEnv: []string{
		"TRACING_ENDPOINT=" + colAddr.String(), "TRACING_SAMPLING=100"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 150*time.Second)
	if m.Nodes[1].UnderlayIP != colAddr.Addr() {
		t.Fatalf("node1's underlay address is %s, not %s", m.Nodes[1].UnderlayIP, colAddr.Addr())
	}
	col := runCollector(t, ctx, m.Nodes[1].NetNS, colAddr.Addr())
	if err := m.AddNamespace(ns, ambientNS); err != nil {
		t.Fatal(err)
	}
	client, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: "client", Namespace: ns, ServiceAccount: "client"})
	if err != nil {
		t.Fatal(err)
	}
	server, err := m.AddPod(ctx, 1, testcluster.PodSpec{Name: "server", Namespace: ns, ServiceAccount: "server"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, client.IP, server.IP); err != nil {
		t.Fatal(err)
	}
	if err := m.ServeEcho(server, 8080); err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(server.IP, 8080)
	testkit.Eventually(t, waitTimeout, "a round trip through the mesh", func() bool {
		got, err := meshlab.RoundTrip(ctxT(t, 5*time.Second), client, dst, []byte("traced"))
		return err == nil && string(got) == "traced"
	})

	// The batch processors export every 5 s.
	var out, in otlpSpan
	for {
		spans := col.spans(t)
		for _, s := range spans {
			if s.Kind == 3 && s.attr("destination.workload") == "server" && s.attr("response_flags") == "-" {
				for _, c := range spans {
					if c.Kind == 2 && c.TraceID == s.TraceID {
						out, in = s, c
					}
				}
			}
		}
		if in.SpanID != "" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no outbound span with its inbound child at the collector (%d spans: %+v)", len(spans), spans)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if in.ParentSpanID != out.SpanID {
		t.Errorf("inbound span's parent %q, want the outbound span %s", in.ParentSpanID, out.SpanID)
	}
	wantName := fmt.Sprintf("outbound server:%d", dst.Port())
	if out.Name != wantName || in.Name != fmt.Sprintf("inbound server:%d", dst.Port()) {
		t.Errorf("span names %q and %q, want %q and inbound", out.Name, in.Name, wantName)
	}
	for _, s := range []otlpSpan{out, in} {
		for k, v := range map[string]string{"source.workload": "client", "destination.workload": "server",
			"source.principal":           "spiffe://cluster.local/ns/" + ns + "/sa/client",
			"destination.principal":      "spiffe://cluster.local/ns/" + ns + "/sa/server",
			"connection_security_policy": "mutual_tls"} {
			if got := s.attr(k); got != v {
				t.Errorf("%s span: %s = %q, want %q", s.Name, k, got, v)
			}
		}
	}
	if out.attr("node_id") != "node0" || in.attr("node_id") != "node1" {
		t.Errorf("node_id %q and %q, want node0 and node1", out.attr("node_id"), in.attr("node_id"))
	}
	t.Logf("trace %s: outbound %s (node0) → inbound %s (node1)", out.TraceID, out.SpanID, in.SpanID)
}

// TestTelemetryOTelAccessLog: a Telemetry object attached to the waypoint
// turns on an envoyOtelAls provider (meshConfig.extensionProviders), and
// the next requests' access logs reach a real OpenTelemetry Collector
// over OTLP/gRPC: the body in Istio's default format, the provider's
// labels as attributes, under its logName. The collector runs in node0's
// namespace at its underlay address, which the mesh config names before
// the control plane starts.
func TestTelemetryOTelAccessLog(t *testing.T) {
	const ns = "otelals"
	colAddr := netip.AddrPortFrom(testcluster.NodeUnderlayIP(0), 4317)
	meshConfig := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(meshConfig, []byte(fmt.Sprintf(`
extensionProviders:
- name: otel-als
  envoyOtelAls:
    service: %q
    port: %d
    logName: e2e_als
    logFormat:
      labels: {code: "%%RESPONSE_CODE%%", method: "%%REQ(:METHOD)%%"}
`, colAddr.Addr().String(), colAddr.Port())), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 150*time.Second)
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: ns, Service: "web",
		Options: meshlab.Options{Name: ns, CPArgs: []string{"--mesh-config", meshConfig}},
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { fmt.Fprint(rw, "web") })})
	if w.Mesh.Nodes[0].UnderlayIP != colAddr.Addr() {
		t.Fatalf("node0's underlay address is %s, not %s", w.Mesh.Nodes[0].UnderlayIP, colAddr.Addr())
	}
	col := runCollector(t, ctx, w.Mesh.Nodes[0].NetNS, colAddr.Addr())
	if err := w.Mesh.Apply("e2e-otel-als", []byte(`
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: e2e-otel-als, namespace: demo}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  accessLogging:
  - providers: [{name: otel-als}]
`)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Mesh.Remove("e2e-otel-als") })
	// The Telemetry reaches the waypoint within a push; requests until
	// one is logged (the exporter batches every second).
	for {
		if code, body := w.do(t, "/otel-als", nil); code != http.StatusOK {
			t.Fatalf("GET /otel-als: %d %s", code, body)
		}
		for _, l := range col.logs(t) {
			if !strings.Contains(l.Body, "/otel-als") {
				continue
			}
			// %BYTES_RECEIVED% %BYTES_SENT%: the bodies, none and "web".
			if l.Scope != "e2e_als" || l.Attrs["code"] != "200" || l.Attrs["method"] != "GET" ||
				!strings.Contains(l.Body, `"GET /otel-als HTTP/1.1" 200 `) || !strings.Contains(l.Body, `"-" 0 3 `) {
				t.Fatalf("access log record: logger %q, body %q, attributes %v", l.Scope, l.Body, l.Attrs)
			}
			t.Logf("collector got: %s: %s %v", l.Scope, l.Body, l.Attrs)
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no access log record at the collector (%d records)", len(col.logs(t)))
		case <-time.After(500 * time.Millisecond):
		}
	}
}
