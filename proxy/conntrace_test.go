package proxy

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/proxy/conntrace"
)

// spanRecorder is a tracer whose spans are kept in memory, sampling every
// new trace.
func spanRecorder(t *testing.T) (*conntrace.Tracer, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tr, err := conntrace.New(conntrace.Config{SamplingPercentage: 100, Exporter: exp, BatchTimeout: 10 * time.Millisecond,
		Attributes: []attribute.KeyValue{attribute.String("node_id", "node0")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close(context.Background()) })
	return tr, exp
}

// flushed exports what the tracer holds and returns every span so far.
func flushed(t *testing.T, tr *conntrace.Tracer, exp *tracetest.InMemoryExporter) tracetest.SpanStubs {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return exp.GetSpans()
}

// waitSpans flushes until n spans are out (a connection's span ends after
// the client has closed its end) or 5 s have passed.
func waitSpans(t *testing.T, tr *conntrace.Tracer, exp *tracetest.InMemoryExporter, n int) tracetest.SpanStubs {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		spans := flushed(t, tr, exp)
		if len(spans) >= n || time.Now().After(deadline) {
			return spans
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func spanAttr(s tracetest.SpanStub, k string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == k {
			return a.Value.Emit()
		}
	}
	return ""
}

// TestOutboundConnectionSpan: an outbound HBONE connection is one client
// span, and the CONNECT carries it as a sampled traceparent, so the next
// proxy's span is its child.
func TestOutboundConnectionSpan(t *testing.T) {
	tr, exp := spanRecorder(t)
	h := newOutboundHarness(t, false, 0, tr)
	openEchoClose(t, h.addr, 1, func() {})
	var tp string
	select {
	case tp = <-h.traceparents:
	case <-time.After(5 * time.Second):
		t.Fatal("the destination saw no CONNECT")
	}
	spans := waitSpans(t, tr, exp, 1)
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1: %+v", len(spans), spans)
	}
	s := spans[0]
	if want := "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"; tp != want {
		t.Errorf("CONNECT traceparent %q, want the span's %q", tp, want)
	}
	if s.SpanKind != trace.SpanKindClient || s.Parent.IsValid() {
		t.Errorf("span kind %v parent %v, want a client span starting its trace", s.SpanKind, s.Parent)
	}
	if !strings.HasPrefix(s.Name, "outbound server:") {
		t.Errorf("span name %q, want outbound server:<port>", s.Name)
	}
	for k, v := range map[string]string{"source.workload": "client", "destination.workload": "server",
		"source.principal": "spiffe://cluster.local/ns/apps/sa/sa-client", "connection_security_policy": "mutual_tls",
		"response_flags": "-", "bytes_sent": "1024", "bytes_received": "1024", "node_id": "node0"} {
		if got := spanAttr(s, k); got != v {
			t.Errorf("attribute %s = %q, want %q", k, got, v)
		}
	}
}

// TestOutboundUntracedTraceparent: with tracing off the CONNECT still
// carries a random, unsampled traceparent (what Istio's ztunnel sends).
func TestOutboundUntracedTraceparent(t *testing.T) {
	h := newOutboundHarness(t, false, 0, nil)
	openEchoClose(t, h.addr, 1, func() {})
	select {
	case tp := <-h.traceparents:
		if !hbone.ValidTraceparent(tp) || !strings.HasSuffix(tp, "-00") {
			t.Errorf("traceparent %q, want a valid unsampled one", tp)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the destination saw no CONNECT")
	}
}

// TestInboundConnectionSpan: an inbound tunnel's span is the child of the
// CONNECT's traceparent, sampled or not as it says; without one it starts
// a trace of its own.
func TestInboundConnectionSpan(t *testing.T) {
	tr, exp := spanRecorder(t)
	e := newPodEnvWith(t, tr)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, tp := range []string{
		"00-" + traceID + "-" + parentID + "-01",
		"00-5bf92f3577b34da6a3ce929d0e0e4736-" + parentID + "-00", // the client decided not to sample
		"not a traceparent",
	} {
		tun, err := e.connectTraced(t, "10.55.0.1:8080", tp)
		if err != nil {
			t.Fatal(err)
		}
		line := make([]byte, 64)
		if _, err := tun.Read(line); err != nil {
			t.Fatal(err)
		}
		tun.Close()
	}
	spans := waitSpans(t, tr, exp, 2)
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2 (the sampled parent's child and a new trace): %+v", len(spans), spans)
	}
	for _, s := range spans {
		if s.SpanKind != trace.SpanKindServer || s.Name != "inbound pod:8080" {
			t.Errorf("span %q kind %v, want inbound pod:8080, kind server", s.Name, s.SpanKind)
		}
		switch s.SpanContext.TraceID().String() {
		case traceID:
			if s.Parent.SpanID().String() != parentID || !s.Parent.IsRemote() {
				t.Errorf("child span's parent %v, want the CONNECT's %s", s.Parent, parentID)
			}
			if got := spanAttr(s, "source.principal"); got != "spiffe://cluster.local/ns/apps/sa/peer" {
				t.Errorf("source.principal %q, want the peer's certificate", got)
			}
		default:
			if s.Parent.IsValid() {
				t.Errorf("span of a malformed traceparent has parent %v, want a new trace", s.Parent)
			}
		}
	}
}

// connectTraced sends one CONNECT to the pod's 15008 as peer, with a
// traceparent.
func (e *podEnv) connectTraced(t *testing.T, authority, traceparent string) (*hbone.Tunnel, error) {
	t.Helper()
	return e.connectReq(t, &hbone.ConnectRequest{Authority: netip.MustParseAddrPort(authority), Traceparent: traceparent})
}
