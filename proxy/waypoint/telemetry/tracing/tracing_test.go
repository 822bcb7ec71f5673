package tracing

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/otlptest"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry"
)

const (
	clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan  = "00f067aa0ba902b7"
)

func TestExtract(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hdr      map[string]string
		trace    string // "": no parent
		span     string
		decision decision
		sampled  bool
	}{
		{"traceparent sampled", map[string]string{"traceparent": "00-" + clientTrace + "-" + clientSpan + "-01"}, clientTrace, clientSpan, decideParent, true},
		{"traceparent not sampled", map[string]string{"traceparent": "00-" + clientTrace + "-" + clientSpan + "-00"}, clientTrace, clientSpan, decideParent, false},
		{"traceparent wins over b3", map[string]string{"traceparent": "00-" + clientTrace + "-" + clientSpan + "-01", "b3": "0"}, clientTrace, clientSpan, decideParent, true},
		{"traceparent malformed", map[string]string{"traceparent": "00-xyz-" + clientSpan + "-01"}, "", "", decideLocal, false},
		{"traceparent zero trace", map[string]string{"traceparent": "00-00000000000000000000000000000000-" + clientSpan + "-01"}, "", "", decideLocal, false},
		{"traceparent future version", map[string]string{"traceparent": "01-" + clientTrace + "-" + clientSpan + "-01-extra"}, clientTrace, clientSpan, decideParent, true},
		{"b3 single", map[string]string{"b3": clientTrace + "-" + clientSpan + "-1"}, clientTrace, clientSpan, decideParent, true},
		{"b3 single 64-bit", map[string]string{"b3": "a3ce929d0e0e4736-" + clientSpan + "-0"}, "0000000000000000a3ce929d0e0e4736", clientSpan, decideParent, false},
		{"b3 single deferred", map[string]string{"b3": clientTrace + "-" + clientSpan}, clientTrace, clientSpan, decideLocal, false},
		{"b3 deny", map[string]string{"b3": "0"}, "", "", decideDrop, false},
		{"b3 multi", map[string]string{"X-B3-TraceId": clientTrace, "X-B3-SpanId": clientSpan, "X-B3-Sampled": "1"}, clientTrace, clientSpan, decideParent, true},
		{"b3 multi debug", map[string]string{"X-B3-TraceId": clientTrace, "X-B3-SpanId": clientSpan, "X-B3-Flags": "1"}, clientTrace, clientSpan, decideParent, true},
		{"b3 multi deferred", map[string]string{"X-B3-TraceId": clientTrace, "X-B3-SpanId": clientSpan}, clientTrace, clientSpan, decideLocal, false},
		{"b3 sampled alone", map[string]string{"X-B3-Sampled": "0"}, "", "", decideDrop, false},
		{"none", nil, "", "", decideLocal, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.hdr {
				h.Set(k, v)
			}
			in := extract(h)
			if tc.trace == "" {
				if in.parent.IsValid() {
					t.Fatalf("parent %v, want none", in.parent)
				}
			} else if got := in.parent.TraceID().String() + "/" + in.parent.SpanID().String(); got != tc.trace+"/"+tc.span {
				t.Fatalf("parent %s, want %s/%s", got, tc.trace, tc.span)
			}
			if in.decision != tc.decision || in.parent.IsSampled() != tc.sampled {
				t.Fatalf("decision %d sampled %v, want %d %v", in.decision, in.parent.IsSampled(), tc.decision, tc.sampled)
			}
		})
	}
}

func TestInject(t *testing.T) {
	tid, _ := trace.TraceIDFromHex(clientTrace)
	sid, _ := trace.SpanIDFromHex("1111111111111111")
	parent, _ := trace.SpanIDFromHex(clientSpan)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	h := http.Header{}
	h.Set("b3", "whatever")
	h.Set("X-B3-Flags", "1")
	inject(h, sc, parent, &incoming{singleB3: true, tracestate: "vendor=x"})
	want := map[string]string{
		"traceparent":       "00-" + clientTrace + "-1111111111111111-01",
		"tracestate":        "vendor=x",
		"x-b3-traceid":      clientTrace,
		"x-b3-spanid":       "1111111111111111",
		"x-b3-parentspanid": clientSpan,
		"x-b3-sampled":      "1",
		"x-b3-flags":        "",
		"b3":                clientTrace + "-1111111111111111-1-" + clientSpan,
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestEnsureRequestID(t *testing.T) {
	h := http.Header{}
	EnsureRequestID(h)
	id := h.Get("x-request-id")
	if !uuidRE.MatchString(id) {
		t.Fatalf("x-request-id %q is not a version 4 UUID", id)
	}
	EnsureRequestID(h)
	if h.Get("x-request-id") != id {
		t.Fatal("an x-request-id present was replaced")
	}
	h2 := http.Header{}
	EnsureRequestID(h2)
	if h2.Get("x-request-id") == id {
		t.Fatal("two requests got one id")
	}
}

// TestRequestPathAllocs: with tracing off the span steps allocate nothing,
// and a generated request id is one allocation.
func TestRequestPathAllocs(t *testing.T) {
	var pol *Policy
	h := http.Header{"X-Request-Id": {"given"}}
	e := &telemetry.Entry{Attrs: &stream.Attrs{}}
	if n := testing.AllocsPerRun(200, func() {
		EnsureRequestID(h)
		sp := pol.Start(h, time.Time{})
		sp.Inject(h)
		sp.End(e)
	}); n != 0 {
		t.Errorf("tracing off: %v allocations per request, want 0", n)
	}
	if n := testing.AllocsPerRun(200, func() {
		delete(h, "X-Request-Id")
		EnsureRequestID(h)
	}); n != 1 {
		t.Errorf("generating x-request-id: %v allocations, want 1", n)
	}
}

func newPolicy(t *testing.T, tr *Tracer, cfg Config) *Policy {
	t.Helper()
	pol, err := tr.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func entry(code int) *telemetry.Entry {
	req := httptest.NewRequest(http.MethodGet, "http://server.demo.svc.cluster.local/path?q=1", nil)
	req.Header.Set("User-Agent", "test-agent")
	req.Header.Set("X-Tenant", "acme")
	return &telemetry.Entry{
		Src: netip.MustParseAddrPort("10.0.0.1:5555"), Dst: netip.MustParseAddrPort("10.96.0.1:80"),
		Attrs: &stream.Attrs{HTTP: true, Host: "server.demo.svc.cluster.local", Method: "GET", Path: "/path",
			Service: "server.demo.svc.cluster.local"},
		Req: req, Code: code, Upstream: "hbone", UpstreamTo: netip.MustParseAddrPort("10.0.0.2:8080"), Duration: time.Millisecond,
		Sizes: telemetry.Sizes{Request: 110, Response: 120, RequestBody: 10, ResponseBody: 20},
	}
}

// TestExport sends one sampled span over each protocol to a receiver and
// checks what Envoy's waypoint span carries.
func TestExport(t *testing.T) {
	rcv := otlptest.Start(t)
	t.Setenv("ZTG_TEST_TAG", "from-env")
	for _, proto := range []Protocol{GRPC, HTTP} {
		t.Run(proto.String(), func(t *testing.T) {
			tr := New(Identity{CanonicalService: "waypoint", Namespace: "demo", NodeID: "waypoint~1.2.3.4~wp.demo~demo.svc.cluster.local"}, nil)
			tr.BatchTimeout = 10 * time.Millisecond
			t.Cleanup(func() { tr.Close(t.Context()) })
			addr := rcv.GRPCAddr
			if proto == HTTP {
				addr = rcv.HTTPAddr
			}
			pol := newPolicy(t, tr, Config{Provider: &Provider{Name: "otel", Endpoint: addr, Protocol: proto},
				RandomSamplingPercentage: 0, CustomTags: []CustomTag{
					{Name: "lit", Kind: Literal, Value: "v"},
					{Name: "env", Kind: Environment, Value: "ZTG_TEST_TAG"},
					{Name: "tenant", Kind: Header, Value: "x-tenant"},
					{Name: "missing", Kind: Header, Value: "x-none", Default: "dflt"},
				}})
			tid := "5bf92f3577b34da6a3ce929d0e0e47" + map[Protocol]string{GRPC: "01", HTTP: "02"}[proto]
			e := entry(503)
			e.Req.Header.Set("traceparent", "00-"+tid+"-"+clientSpan+"-01") // sampled upstream: 0% does not matter
			EnsureRequestID(e.Req.Header)
			sp := pol.Start(e.Req.Header, time.Now())
			up := http.Header{}
			sp.Inject(up)
			sp.End(e)
			got := rcv.WaitTrace(t, tid)
			if got.ParentID != clientSpan || got.Kind != tracepb.Span_SPAN_KIND_SERVER {
				t.Errorf("span parent %s kind %v, want %s, server", got.ParentID, got.Kind, clientSpan)
			}
			if want := "00-" + tid + "-" + got.SpanID + "-01"; up.Get("traceparent") != want {
				t.Errorf("upstream traceparent %q, want %q", up.Get("traceparent"), want)
			}
			if got.Name != "server.demo.svc.cluster.local:80/*" || got.Service != "waypoint.demo" {
				t.Errorf("name %q service %q", got.Name, got.Service)
			}
			for k, v := range map[string]string{
				"http.method": "GET", "http.url": "http://server.demo.svc.cluster.local/path?q=1", "http.status_code": "503",
				"upstream_cluster": "inbound-vip|80|http|server.demo.svc.cluster.local", "user_agent": "test-agent",
				"node_id": "waypoint~1.2.3.4~wp.demo~demo.svc.cluster.local", "istio.canonical_service": "waypoint",
				"istio.namespace": "demo", "guid:x-request-id": e.Req.Header.Get("x-request-id"), "error": "true",
				"lit": "v", "env": "from-env", "tenant": "acme", "missing": "dflt", "request_size": "10", "response_size": "20",
				"upstream_address": "10.0.0.2:8080", "peer.address": "10.0.0.1",
			} {
				if got.Attrs[k] != v {
					t.Errorf("attribute %s: %q, want %q", k, got.Attrs[k], v)
				}
			}
		})
	}
}

// TestSampling: a request's own decision wins; without one the
// percentage decides.
func TestSampling(t *testing.T) {
	tr := New(Identity{}, nil)
	tr.newExporter = nil // no export: only decisions
	for _, tc := range []struct {
		pct     float64
		hdr     string
		val     string
		sampled bool
	}{
		{0, "", "", false},
		{100, "", "", true},
		{0, "traceparent", "00-" + clientTrace + "-" + clientSpan + "-01", true},
		{100, "traceparent", "00-" + clientTrace + "-" + clientSpan + "-00", false},
		{100, "b3", "0", false},
		{0, "b3", "1", true},
		{100, "b3", clientTrace + "-" + clientSpan, true},
		{0, "b3", clientTrace + "-" + clientSpan, false},
	} {
		pol := newPolicy(t, tr, Config{Provider: &Provider{Endpoint: "127.0.0.1:1"}, RandomSamplingPercentage: tc.pct, DisableSpanReporting: true})
		h := http.Header{}
		if tc.hdr != "" {
			h.Set(tc.hdr, tc.val)
		}
		sp := pol.Start(h, time.Now())
		if got := sp.SpanContext().IsSampled(); got != tc.sampled {
			t.Errorf("%v%% %s=%q: sampled %v, want %v", tc.pct, tc.hdr, tc.val, got, tc.sampled)
		}
		up := http.Header{}
		sp.Inject(up)
		if up.Get("traceparent") == "" || !sp.SpanContext().IsValid() {
			t.Errorf("%v%% %s=%q: no trace context propagated", tc.pct, tc.hdr, tc.val)
		}
	}
	// Envoy's request id sampling: the same id, the same decision.
	pol := newPolicy(t, tr, Config{Provider: &Provider{Endpoint: "127.0.0.1:1"}, RandomSamplingPercentage: 50, UseRequestID: true,
		DisableSpanReporting: true})
	for _, c := range []struct {
		id      string
		sampled bool
	}{{"00001388-0000-4000-8000-000000000000", false}, {"00001387-0000-4000-8000-000000000000", true}} { // 0x1388 = 5000
		h := http.Header{"X-Request-Id": {c.id}}
		if got := pol.Start(h, time.Now()).SpanContext().IsSampled(); got != c.sampled {
			t.Errorf("x-request-id %s at 50%%: sampled %v, want %v", c.id, got, c.sampled)
		}
	}
	if _, err := tr.Compile(Config{Provider: &Provider{Endpoint: "x:1"}, RandomSamplingPercentage: 101}); err == nil {
		t.Error("101% accepted")
	}
}

// TestRetain: policies naming one provider share its pipeline; one no
// policy names any more is shut down.
func TestRetain(t *testing.T) {
	tr := New(Identity{}, nil)
	a := newPolicy(t, tr, Config{Provider: &Provider{Endpoint: "127.0.0.1:1"}, RandomSamplingPercentage: 1})
	b := newPolicy(t, tr, Config{Provider: &Provider{Endpoint: "127.0.0.1:1"}, RandomSamplingPercentage: 50})
	if a.pipe != b.pipe {
		t.Fatal("two policies of one provider got two pipelines")
	}
	c := newPolicy(t, tr, Config{Provider: &Provider{Endpoint: "127.0.0.1:2", Protocol: HTTP}})
	tr.Retain(c)
	if len(tr.pipelines) != 1 || tr.pipelines[c.pipe.key] != c.pipe {
		t.Fatalf("after Retain: %d pipelines", len(tr.pipelines))
	}
	tr.Retain()
	if len(tr.pipelines) != 0 {
		t.Fatal("Retain() left a pipeline")
	}
}

// BenchmarkRequestPath: what tracing adds to a request: a generated
// x-request-id, and a sampled span started, propagated and ended (without
// export: span reporting disabled).
func BenchmarkRequestPath(b *testing.B) {
	b.Run("request-id", func(b *testing.B) {
		h := http.Header{}
		b.ReportAllocs()
		for b.Loop() {
			delete(h, "X-Request-Id")
			EnsureRequestID(h)
		}
	})
	b.Run("span", func(b *testing.B) {
		tr := New(Identity{}, nil)
		pol, err := tr.Compile(Config{Provider: &Provider{Endpoint: "127.0.0.1:1"}, RandomSamplingPercentage: 100, DisableSpanReporting: true})
		if err != nil {
			b.Fatal(err)
		}
		e := entry(200)
		up := http.Header{}
		b.ReportAllocs()
		for b.Loop() {
			sp := pol.Start(e.Req.Header, time.Now())
			sp.Inject(up)
			sp.End(e)
		}
	})
}
