// Package otlptest is an in-process OTLP trace receiver for unit tests: it
// serves OTLP/gRPC and OTLP/HTTP (protobuf) on loopback and keeps every
// span it receives with its resource's service.name. The e2e tests use the
// real OpenTelemetry Collector (hack/otelcol) instead.
package otlptest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, ids in hex.
type Span struct {
	TraceID, SpanID, ParentID string
	Name                      string
	Kind                      tracepb.Span_SpanKind
	Attrs                     map[string]string // string, int and bool values, as text
	Service                   string            // the resource's service.name
}

// Receiver collects spans; GRPCAddr and HTTPAddr are its two endpoints.
type Receiver struct {
	GRPCAddr, HTTPAddr string
	mu                 sync.Mutex
	spans              []Span
	changed            chan struct{}
}

type grpcServer struct {
	collectorpb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s grpcServer) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	s.r.add(req)
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// Start serves both endpoints until the test ends.
func Start(t testing.TB) *Receiver {
	r := &Receiver{changed: make(chan struct{})}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(gs, grpcServer{r: r})
	go gs.Serve(gl)
	t.Cleanup(gs.Stop)
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, err := io.ReadAll(req.Body)
		var m collectorpb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &m)
		}
		if err != nil || req.URL.Path != "/v1/traces" {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		r.add(&m)
		out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	})}
	go hs.Serve(hl)
	t.Cleanup(func() { hs.Close() })
	r.GRPCAddr, r.HTTPAddr = gl.Addr().String(), hl.Addr().String()
	return r
}

func (r *Receiver) add(req *collectorpb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		svc := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				svc = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s := Span{TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					ParentID: hex.EncodeToString(sp.GetParentSpanId()), Name: sp.GetName(), Kind: sp.GetKind(),
					Attrs: map[string]string{}, Service: svc}
				for _, kv := range sp.GetAttributes() {
					s.Attrs[kv.GetKey()] = valueText(kv.GetValue())
				}
				r.spans = append(r.spans, s)
			}
		}
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

func valueText(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10) // zero too: a size of 0 is a value
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	}
	return ""
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// WaitTrace waits (up to 30 s) for a span of trace id tid and returns it.
func (r *Receiver) WaitTrace(t testing.TB, tid string) Span {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		ch := r.changed
		for _, s := range r.spans {
			if s.TraceID == tid {
				r.mu.Unlock()
				return s
			}
		}
		r.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no span of trace %s received (%d spans)", tid, len(r.Spans()))
			return Span{}
		}
	}
}
