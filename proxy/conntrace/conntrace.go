// Package conntrace is the node proxy's connection spans: when a tracing
// endpoint is configured (TRACING_ENDPOINT), each connection the proxy
// carries is one span, kind client for outbound and server for inbound,
// exported over OTLP in batches off the connection path.
//
// The HBONE CONNECT request is how a trace crosses nodes. Outbound, the
// traceparent the proxy sends (one per connection, as Istio's ztunnel
// does) is the context of the outbound span, sampled flag included, so the
// receiving proxy's span is its child. Inbound, the CONNECT's traceparent
// is the remote parent and its sampled flag is obeyed; a connection that
// arrives without one (plain TCP, or a malformed header) starts a new
// trace, sampled at the configured percentage. Istio's ztunnel sends its
// traceparent unsampled, so connections from it are not traced here.
//
// A nil *Tracer is tracing off: Outbound and Inbound return nil, and a nil
// *Span does nothing (the CONNECT then carries a random unsampled
// traceparent, as before).
package conntrace

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/otlp"
)

// Config is where spans go and which are kept.
type Config struct {
	Endpoint otlp.Endpoint
	// SamplingPercentage is the share of new traces sampled, 0 to 100; a
	// connection whose CONNECT carried a traceparent follows its flag.
	SamplingPercentage float64
	// ServiceName is the resource's service.name; "": "ztunnel".
	ServiceName string
	// Attributes are on every span (the node, the cluster).
	Attributes []attribute.KeyValue
	// BatchTimeout is the longest a span waits before export; 0: 5 s.
	BatchTimeout time.Duration
	// Exporter replaces the OTLP exporter (tests).
	Exporter sdktrace.SpanExporter
}

// Tracer makes the spans of one node proxy.
type Tracer struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	fixed  []attribute.KeyValue
}

// New starts the export pipeline (it connects lazily: a collector that is
// down costs dropped batches, never a blocked connection).
func New(cfg Config) (*Tracer, error) {
	if p := cfg.SamplingPercentage; math.IsNaN(p) || p < 0 || p > 100 {
		return nil, fmt.Errorf("conntrace: sampling percentage %v is not in [0, 100]", p)
	}
	exp := cfg.Exporter
	if exp == nil {
		var err error
		if exp, err = otlp.NewTraceExporter(cfg.Endpoint); err != nil {
			return nil, fmt.Errorf("conntrace: %w", err)
		}
	}
	bt := cfg.BatchTimeout
	if bt <= 0 {
		bt = 5 * time.Second
	}
	name := cfg.ServiceName
	if name == "" {
		name = "ztunnel"
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SamplingPercentage/100))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", name))),
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(bt)))
	return &Tracer{tp: tp, tracer: tp.Tracer("github.com/ztunnel-go/ztunnel-go/proxy"), fixed: cfg.Attributes}, nil
}

// Close exports what is queued (until ctx ends) and stops the pipeline.
func (t *Tracer) Close(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// Flush exports the spans ended so far (until ctx ends).
func (t *Tracer) Flush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.ForceFlush(ctx)
}

// Span is one connection's span.
type Span struct {
	t    *Tracer
	span trace.Span
}

// Outbound starts the span of an outbound connection accepted at start: a
// new trace, sampled at the configured percentage.
func (t *Tracer) Outbound(start time.Time) *Span {
	if t == nil {
		return nil
	}
	_, sp := t.tracer.Start(context.Background(), "outbound", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(start))
	return &Span{t: t, span: sp}
}

// Inbound starts the span of an inbound connection accepted at start,
// the child of the W3C traceparent its CONNECT carried ("" or malformed:
// a new trace).
func (t *Tracer) Inbound(traceparent string, start time.Time) *Span {
	if t == nil {
		return nil
	}
	ctx := context.Background()
	if traceparent != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
	}
	_, sp := t.tracer.Start(ctx, "inbound", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start))
	return &Span{t: t, span: sp}
}

// Traceparent is the span's context as a W3C traceparent, for the CONNECT
// the connection opens; "" for a nil span (the HBONE client then makes a
// random one).
func (s *Span) Traceparent() string {
	if s == nil {
		return ""
	}
	sc := s.span.SpanContext()
	flags := "00"
	if sc.IsSampled() {
		flags = "01"
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + flags
}

// SpanContext is the span's context (zero for a nil span).
func (s *Span) SpanContext() trace.SpanContext {
	if s == nil {
		return trace.SpanContext{}
	}
	return s.span.SpanContext()
}

// End names the span, adds attrs (and the tracer's own) and ends it at
// end; failed marks it an error. A span not sampled costs nothing more.
func (s *Span) End(name string, attrs []attribute.KeyValue, failed bool, end time.Time) {
	if s == nil {
		return
	}
	if s.span.IsRecording() {
		s.span.SetName(name)
		s.span.SetAttributes(s.t.fixed...)
		s.span.SetAttributes(attrs...)
		if failed {
			s.span.SetAttributes(attribute.Bool("error", true))
			s.span.SetStatus(codes.Error, "")
		}
	}
	s.span.End(trace.WithTimestamp(end))
}

// LogErrors is an OpenTelemetry error handler (otel.SetErrorHandler) that
// logs what the exporter reports to log, once per distinct message a
// minute: a collector that is down fails every batch, and one line says so.
func LogErrors(log *zap.Logger) otel.ErrorHandler {
	h := &errorLog{log: log, seen: map[string]time.Time{}}
	return otel.ErrorHandlerFunc(h.handle)
}

type errorLog struct {
	log  *zap.Logger
	mu   sync.Mutex
	seen map[string]time.Time
}

func (h *errorLog) handle(err error) {
	msg := err.Error()
	now := time.Now()
	h.mu.Lock()
	last, ok := h.seen[msg]
	if !ok || now.Sub(last) >= time.Minute {
		if len(h.seen) > 64 {
			clear(h.seen)
		}
		h.seen[msg] = now
		ok = false
	}
	h.mu.Unlock()
	if !ok {
		h.log.Warn("exporting connection spans", zap.Error(err))
	}
}
