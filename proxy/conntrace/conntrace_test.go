package conntrace

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestNilTracerIsOff(t *testing.T) {
	var tr *Tracer
	sp := tr.Outbound(time.Now())
	if sp != nil || sp.Traceparent() != "" || tr.Inbound("x", time.Now()) != nil {
		t.Fatal("a nil tracer made a span")
	}
	sp.End("x", nil, false, time.Now()) // no panic
	if err := tr.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestSampling: at 0% a new trace is not sampled (its traceparent says so
// and nothing is exported), while a sampled parent's child still is.
func TestSampling(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := New(Config{SamplingPercentage: 0, Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close(context.Background())
	out := tr.Outbound(time.Now())
	if tp := out.Traceparent(); !strings.HasSuffix(tp, "-00") || len(tp) != 55 {
		t.Errorf("unsampled traceparent %q", tp)
	}
	out.End("outbound a:80", nil, false, time.Now())
	in := tr.Inbound("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", time.Now())
	if !in.SpanContext().IsSampled() || in.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("child of a sampled parent: %v", in.SpanContext())
	}
	in.End("inbound b:80", nil, true, time.Now())
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Name != "inbound b:80" || spans[0].Status.Code.String() != "Error" {
		t.Fatalf("exported %+v, want only the sampled parent's child, marked an error", spans)
	}
}

func TestConfigErrors(t *testing.T) {
	if _, err := New(Config{SamplingPercentage: 101, Exporter: tracetest.NewInMemoryExporter()}); err == nil {
		t.Error("sampling 101% accepted")
	}
	if _, err := New(Config{SamplingPercentage: 1}); err == nil || !strings.Contains(err.Error(), "no address") {
		t.Errorf("no endpoint: %v", err)
	}
}
