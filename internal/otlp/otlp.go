// Package otlp builds the OpenTelemetry span exporters both proxies use:
// the waypoint's tracing providers and the node proxy's connection spans
// send OTLP the same way, over gRPC or HTTP, without TLS (a collector in
// the mesh is reached through the mesh's own mTLS), connecting lazily.
package otlp

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Protocol is how spans reach the collector.
type Protocol int

const (
	// GRPC is OTLP over gRPC (Istio's opentelemetry provider's default).
	GRPC Protocol = iota
	// HTTP is OTLP over HTTP (protobuf), POSTed to the endpoint's path.
	HTTP
)

func (p Protocol) String() string {
	if p == HTTP {
		return "http"
	}
	return "grpc"
}

// MarshalText names the protocol in JSON (the node proxy logs its config).
func (p Protocol) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// ParseProtocol reads "grpc" or "http" (any case); "" is GRPC.
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(s) {
	case "", "grpc":
		return GRPC, nil
	case "http":
		return HTTP, nil
	}
	return GRPC, fmt.Errorf("OTLP protocol %q: want grpc or http", s)
}

// Endpoint is one collector.
type Endpoint struct {
	// Address is the collector's host:port.
	Address  string
	Protocol Protocol
	// Path is the OTLP/HTTP path; "": /v1/traces.
	Path string
	// Headers are sent with every export (authentication).
	Headers map[string]string
	// Timeout bounds one export; 0: 10 s.
	Timeout time.Duration
}

// NewTraceExporter returns an exporter to e. It does not connect: a
// collector that is down costs dropped batches (the SDK logs them), never a
// blocked connection or request.
func NewTraceExporter(e Endpoint) (sdktrace.SpanExporter, error) {
	if e.Address == "" {
		return nil, fmt.Errorf("OTLP endpoint has no address")
	}
	timeout := e.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx := context.Background()
	if e.Protocol == HTTP {
		path := e.Path
		if path == "" {
			path = "/v1/traces"
		}
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(e.Address), otlptracehttp.WithURLPath(path),
			otlptracehttp.WithInsecure(), otlptracehttp.WithTimeout(timeout)}
		if len(e.Headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(e.Headers))
		}
		return otlptracehttp.New(ctx, opts...)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(e.Address), otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithTimeout(timeout)}
	if len(e.Headers) > 0 {
		opts = append(opts, otlptracegrpc.WithHeaders(e.Headers))
	}
	return otlptracegrpc.New(ctx, opts...)
}
