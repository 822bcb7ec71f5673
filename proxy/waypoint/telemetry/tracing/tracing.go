// Package tracing is the waypoint's distributed tracing, part of its stats
// step: the x-request-id every request carries, and, when a tracing
// provider is configured, one span per request (kind server, as Envoy's
// waypoint reports its HTTP connection manager span) started from the trace
// context the request came with (W3C traceparent/tracestate, B3 single or
// multiple headers), sampled by the request's decision or the random
// sampling percentage, propagated upstream in the same headers, and
// exported in batches over OTLP (gRPC or HTTP) with the OpenTelemetry SDK,
// off the request path.
//
// With no provider configured tracing is off: the Policy is nil, Start
// returns nil and allocates nothing, and trace headers pass through
// untouched. Policies are compiled with the waypoint's config and swapped
// with it (live, no restart); configs naming the same provider share one
// exporter, and one no config names any more is flushed and closed in the
// background (Retain).
package tracing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/otlp"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry"
)

// Protocol is how spans reach the provider's collector.
type Protocol = otlp.Protocol

const (
	// GRPC is OTLP over gRPC (Istio's opentelemetry provider's default).
	GRPC = otlp.GRPC
	// HTTP is OTLP over HTTP (protobuf), POSTed to the provider's path.
	HTTP = otlp.HTTP
)

// Provider is one OpenTelemetry tracing provider (meshConfig's
// extensionProviders[].opentelemetry).
type Provider struct {
	// Name is the extension provider's name (logs only).
	Name string
	// Endpoint is the collector's host:port.
	Endpoint string
	Protocol Protocol
	// Path is the OTLP/HTTP path; "": /v1/traces.
	Path string
	// ServiceName is the resource's service.name; "": the waypoint's
	// "<canonical service>.<namespace>", as Istio names its proxies.
	ServiceName string
	// Headers are sent with every export (authentication).
	Headers map[string]string
	// Timeout bounds one export; 0: 10 s.
	Timeout time.Duration
}

// TagKind says where a custom tag's value comes from.
type TagKind int

const (
	// Literal is a fixed value.
	Literal TagKind = iota
	// Environment is an environment variable of the waypoint (read when
	// the config is applied), Default when unset.
	Environment
	// Header is a request header, Default when absent.
	Header
)

// CustomTag is one of Telemetry's tracing customTags: a span attribute.
type CustomTag struct {
	Name string
	Kind TagKind
	// Value is the literal, the variable's name or the header's name.
	Value   string
	Default string
}

// Config is one tracing configuration (Telemetry's tracing and the
// provider it names), compiled by Tracer.Compile.
type Config struct {
	// Provider is where spans go; nil: tracing is off.
	Provider *Provider
	// RandomSamplingPercentage is the share of new traces sampled, 0 to
	// 100 (a request's own decision, in its traceparent or B3 headers,
	// wins).
	RandomSamplingPercentage float64
	// UseRequestID samples a new trace by its x-request-id, as Envoy's
	// UUID request ID extension does (Telemetry's
	// useRequestIdForTraceSampling): every proxy the request crosses then
	// decides alike. false: by the trace id.
	UseRequestID bool
	CustomTags   []CustomTag
	// DisableSpanReporting keeps propagation and sampling but exports
	// nothing.
	DisableSpanReporting bool
	// MaxPathTagLength truncates http.url; 0: Envoy's 256.
	MaxPathTagLength int
}

// Identity is the waypoint itself, in every span's attributes.
type Identity struct {
	NodeID, Zone                        string
	CanonicalService, CanonicalRevision string
	Namespace, MeshID, ClusterID        string
}

// Tracer is one waypoint's tracing: the export pipelines of the providers
// its configs name, shared by every Policy that names the same one.
type Tracer struct {
	id     Identity
	log    *zap.Logger
	getenv func(string) string
	// newExporter builds a provider's exporter (tests replace it).
	newExporter func(*Provider) (sdktrace.SpanExporter, error)
	// BatchTimeout is the longest a span waits before export; 0: 5 s
	// (Envoy's OpenTelemetry flush interval). Set before Compile.
	BatchTimeout time.Duration

	mu        sync.Mutex
	pipelines map[pipelineKey]*pipeline
}

// pipelineKey is what makes two configs' exports the same.
type pipelineKey struct {
	name, endpoint, path, service, headers string
	protocol                               Protocol
	timeout                                time.Duration
	disabled                               bool
}

// pipeline is one provider's TracerProvider: its batch processor and
// exporter.
type pipeline struct {
	key    pipelineKey
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
}

// Policy is one compiled Config: immutable, read by the request path
// (nil: tracing off).
type Policy struct {
	cfg      Config
	pipe     *pipeline
	tags     []attribute.KeyValue // literal and environment tags, resolved
	hdrTags  []CustomTag
	fixed    []attribute.KeyValue // the waypoint's own attributes
	maxPath  int
	threshld uint64 // sampled when a 63-bit sample value is below it
}

// New returns a tracer. log (nil: none) receives what the exporters say.
func New(id Identity, log *zap.Logger) *Tracer {
	if log == nil {
		log = zap.NewNop()
	}
	return &Tracer{id: id, log: log, getenv: os.Getenv, newExporter: newExporter, pipelines: map[pipelineKey]*pipeline{}}
}

// Compile checks cfg and returns its Policy, starting its provider's
// pipeline unless one runs already; nil for a Config without a provider.
// Call Retain with every Policy in use afterwards, so pipelines no
// config names any more are shut down.
func (t *Tracer) Compile(cfg Config) (*Policy, error) {
	if p := cfg.RandomSamplingPercentage; math.IsNaN(p) || p < 0 || p > 100 {
		return nil, fmt.Errorf("tracing: random sampling percentage %v is not in [0, 100]", p)
	}
	if cfg.Provider == nil {
		return nil, nil
	}
	if cfg.Provider.Endpoint == "" {
		return nil, fmt.Errorf("tracing: provider %q has no endpoint", cfg.Provider.Name)
	}
	pol := &Policy{cfg: cfg, fixed: t.fixedAttrs(), maxPath: cfg.MaxPathTagLength,
		threshld: uint64(cfg.RandomSamplingPercentage / 100 * float64(uint64(1)<<63))}
	if pol.maxPath <= 0 {
		pol.maxPath = 256
	}
	for _, ct := range cfg.CustomTags {
		switch ct.Kind {
		case Literal:
			pol.tags = append(pol.tags, attribute.String(ct.Name, ct.Value))
		case Environment:
			v := t.getenv(ct.Value)
			if v == "" {
				v = ct.Default
			}
			pol.tags = append(pol.tags, attribute.String(ct.Name, v))
		case Header:
			ct.Value = http.CanonicalHeaderKey(ct.Value)
			pol.hdrTags = append(pol.hdrTags, ct)
		}
	}
	p, err := t.pipeline(cfg.Provider, cfg.DisableSpanReporting)
	if err != nil {
		return nil, err
	}
	pol.pipe = p
	return pol, nil
}

func (t *Tracer) pipeline(prov *Provider, disabled bool) (*pipeline, error) {
	hdrs := make([]string, 0, len(prov.Headers))
	for k, v := range prov.Headers {
		hdrs = append(hdrs, k+"\x00"+v)
	}
	sort.Strings(hdrs)
	key := pipelineKey{name: prov.Name, endpoint: prov.Endpoint, path: prov.Path, service: prov.ServiceName,
		headers: strings.Join(hdrs, "\x00"), protocol: prov.Protocol, timeout: prov.Timeout, disabled: disabled}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.pipelines[key]; p != nil {
		return p, nil
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSampler(sampler{}), sdktrace.WithResource(t.resource(prov))}
	if !disabled {
		exp, err := t.newExporter(prov)
		if err != nil {
			return nil, fmt.Errorf("tracing: provider %q: %w", prov.Name, err)
		}
		bt := t.BatchTimeout
		if bt <= 0 {
			bt = 5 * time.Second
		}
		opts = append(opts, sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(bt)))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	p := &pipeline{key: key, tp: tp, tracer: tp.Tracer("github.com/ztunnel-go/ztunnel-go/proxy/waypoint")}
	t.pipelines[key] = p
	t.log.Info("tracing provider started", zap.String("provider", prov.Name), zap.String("endpoint", prov.Endpoint),
		zap.Stringer("protocol", prov.Protocol), zap.Bool("reporting", !disabled))
	return p, nil
}

// Retain shuts down, in the background after flushing them, the pipelines
// none of inUse (nil entries allowed) exports to.
func (t *Tracer) Retain(inUse ...*Policy) {
	keep := map[*pipeline]bool{}
	for _, p := range inUse {
		if p != nil {
			keep[p.pipe] = true
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, p := range t.pipelines {
		if keep[p] {
			continue
		}
		delete(t.pipelines, k)
		t.log.Info("tracing provider stopped", zap.String("provider", k.name), zap.String("endpoint", k.endpoint))
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.tp.Shutdown(ctx); err != nil {
				t.log.Warn("tracing: shutting down a provider", zap.Error(err))
			}
		}()
	}
}

// Close exports what is queued (until ctx ends) and stops every pipeline.
func (t *Tracer) Close(ctx context.Context) error {
	t.mu.Lock()
	ps := t.pipelines
	t.pipelines = map[pipelineKey]*pipeline{}
	t.mu.Unlock()
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.tp.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

func newExporter(p *Provider) (sdktrace.SpanExporter, error) {
	return otlp.NewTraceExporter(otlp.Endpoint{Address: p.Endpoint, Protocol: p.Protocol, Path: p.Path,
		Headers: p.Headers, Timeout: p.Timeout})
}

func (t *Tracer) resource(p *Provider) *resource.Resource {
	name := p.ServiceName
	if name == "" {
		name = t.id.CanonicalService + "." + t.id.Namespace
	}
	return resource.NewSchemaless(attribute.String("service.name", name))
}

// fixedAttrs are the attributes every span of this waypoint has: Envoy's
// node_id and zone, and the istio.* tags Istio adds to its proxies' spans.
func (t *Tracer) fixedAttrs() []attribute.KeyValue {
	id := t.id
	return []attribute.KeyValue{
		attribute.String("node_id", id.NodeID), attribute.String("zone", id.Zone), attribute.String("component", "proxy"),
		attribute.String("istio.canonical_service", id.CanonicalService),
		attribute.String("istio.canonical_revision", orDefault(id.CanonicalRevision, "latest")),
		attribute.String("istio.namespace", id.Namespace), attribute.String("istio.mesh_id", id.MeshID),
		attribute.String("istio.cluster_id", id.ClusterID),
	}
}

// sampler hands the SDK the decision Start made (the pipeline is shared
// by policies of different percentages, so the decision travels in the
// context).
type sampler struct{}

type decisionKey struct{}

func (sampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	res := sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
	if d, _ := p.ParentContext.Value(decisionKey{}).(bool); d {
		res.Decision = sdktrace.RecordAndSample
	}
	return res
}

func (sampler) Description() string { return "ztunnel-go waypoint sampler" }

// sample is the decision for a request: its own when it carried one
// (Envoy respects the sampled flag of the trace context it extends), else
// the random sampling percentage, by its x-request-id (UseRequestID) or
// its trace id.
func (pol *Policy) sample(in *incoming, h http.Header) bool {
	switch {
	case in.decision == decideParent && in.parent.IsValid():
		return in.parent.IsSampled()
	case in.decision == decideSample:
		return true
	case in.decision == decideDrop || pol.threshld == 0:
		return false
	}
	if rid := first(h, hRequestID); pol.cfg.UseRequestID && len(rid) >= 8 {
		// Envoy's UUID extension: the first 8 hex digits, mod 10000,
		// below the percentage in hundredths.
		if x, err := strconv.ParseUint(rid[:8], 16, 32); err == nil {
			return float64(x%10000) < pol.cfg.RandomSamplingPercentage*100
		}
	}
	// By the trace id when the trace came without a decision (B3 defers
	// it), so hops sampling by ratio agree; else at random.
	v := rand.Uint64()
	if in.parent.IsValid() {
		tid := in.parent.TraceID()
		v = 0
		for _, b := range tid[8:] {
			v = v<<8 | uint64(b)
		}
	}
	return v>>1 < pol.threshld
}

// Span is the waypoint's span of one request; a nil *Span (tracing off)
// does nothing.
type Span struct {
	pol    *Policy
	span   trace.Span
	in     incoming
	parent trace.SpanID
	start  time.Time
}

// Start begins the span of a request with header h that arrived at start
// (after EnsureRequestID); nil when pol is nil (tracing off), which costs
// nothing.
func (pol *Policy) Start(h http.Header, start time.Time) *Span {
	if pol == nil {
		return nil
	}
	sp := &Span{pol: pol, in: extract(h), start: start}
	sampled := pol.sample(&sp.in, h)
	ctx := context.WithValue(context.Background(), decisionKey{}, sampled)
	if sp.in.parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sp.in.parent)
		sp.parent = sp.in.parent.SpanID()
	}
	_, sp.span = pol.pipe.tracer.Start(ctx, "waypoint", trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start))
	return sp
}

// Inject writes the span's context into the upstream request's header h,
// so the upstream's span is the waypoint span's child.
func (s *Span) Inject(h http.Header) {
	if s == nil {
		return
	}
	inject(h, s.span.SpanContext(), s.parent, &s.in)
}

// SpanContext is the span's context (zero for a nil Span).
func (s *Span) SpanContext() trace.SpanContext {
	if s == nil {
		return trace.SpanContext{}
	}
	return s.span.SpanContext()
}

// End names the span, gives it Envoy's attributes from the stats step's
// entry e, and ends it (a span not sampled is dropped here).
func (s *Span) End(e *telemetry.Entry) {
	if s == nil {
		return
	}
	end := s.start.Add(e.Duration)
	if !s.span.IsRecording() {
		s.span.End(trace.WithTimestamp(end))
		return
	}
	s.span.SetName(operationName(e))
	pol := s.pol
	attrs := make([]attribute.KeyValue, 0, 24+len(pol.tags)+len(pol.hdrTags))
	attrs = append(attrs, pol.fixed...)
	var h http.Header
	if e.Req != nil {
		h = e.Req.Header
	}
	proto := "HTTP/1.1"
	if e.Req != nil {
		proto = e.Req.Proto
	}
	cluster := "-"
	if e.Attrs.Service != "" {
		cluster = "inbound-vip|" + strconv.Itoa(int(e.Dst.Port())) + "|http|" + e.Attrs.Service
	}
	attrs = append(attrs,
		attribute.String("guid:x-request-id", first(h, hRequestID)),
		attribute.String("http.url", truncate("http://"+e.Attrs.Host+requestURI(e), pol.maxPath)),
		attribute.String("http.method", e.Attrs.Method),
		attribute.String("http.protocol", proto),
		attribute.String("downstream_cluster", "-"),
		attribute.String("user_agent", orDefault(first(h, hUserAgent), "-")),
		attribute.String("peer.address", e.Src.Addr().String()),
		attribute.Int64("request_size", e.Sizes.RequestBody),
		attribute.Int64("response_size", e.Sizes.ResponseBody),
		attribute.String("upstream_cluster", cluster),
		attribute.String("upstream_cluster.name", cluster),
		attribute.String("http.status_code", strconv.Itoa(e.Code)),
		attribute.String("response_flags", orDefault(e.Flags, "-")),
		attribute.String("source.workload", e.Source.Workload),
		attribute.String("source.namespace", e.Source.Namespace),
	)
	if up := e.UpstreamAddress(); up != "" {
		attrs = append(attrs, attribute.String("upstream_address", up))
	}
	if e.Route != "" {
		attrs = append(attrs, attribute.String("route_name", e.Route))
	}
	attrs = append(attrs, pol.tags...)
	for _, ct := range pol.hdrTags {
		attrs = append(attrs, attribute.String(ct.Name, orDefault(first(h, ct.Value), ct.Default)))
	}
	if e.Code >= 500 || e.Code == 0 {
		attrs = append(attrs, attribute.Bool("error", true))
		s.span.SetStatus(codes.Error, "")
	}
	s.span.SetAttributes(attrs...)
	s.span.End(trace.WithTimestamp(end))
}

// operationName is Envoy's span name for Istio's routes: the decorator
// "<service host>:<port>/*", the Host header for a workload addressed.
func operationName(e *telemetry.Entry) string {
	if e.Attrs.Service != "" {
		return e.Attrs.Service + ":" + strconv.Itoa(int(e.Dst.Port())) + "/*"
	}
	return e.Attrs.Host + "/*"
}

func requestURI(e *telemetry.Entry) string {
	if e.Req != nil && e.Req.URL != nil {
		return e.Req.URL.RequestURI()
	}
	return e.Attrs.Path
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// requestID is one generated x-request-id: the header's value slice and
// the text it points into, one allocation.
type requestID struct {
	v [1]string
	b [uuidLen]byte
}

// EnsureRequestID gives a request without an x-request-id one: a random
// UUID (version 4), as Envoy's connection manager generates it, whether
// tracing is on or not. One allocation when it adds one, none otherwise.
func EnsureRequestID(h http.Header) {
	if vs := h[hRequestID]; len(vs) > 0 && vs[0] != "" {
		return
	}
	id := new(requestID)
	writeUUID(&id.b)
	// The bytes are never written again: the string may point at them.
	id.v[0] = unsafe.String(&id.b[0], uuidLen)
	h[hRequestID] = id.v[:1:1]
}

const hexDigits = "0123456789abcdef"

// writeUUID writes a random version 4 UUID, 8-4-4-4-12 hex digits.
func writeUUID(b *[uuidLen]byte) {
	var r [16]byte
	hi, lo := rand.Uint64(), rand.Uint64()
	for i := range 8 {
		r[i], r[8+i] = byte(hi>>(56-8*i)), byte(lo>>(56-8*i))
	}
	r[6] = r[6]&0x0f | 0x40 // version 4
	r[8] = r[8]&0x3f | 0x80 // RFC 4122 variant
	j := 0
	for i, c := range r {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b[j] = '-'
			j++
		}
		b[j], b[j+1] = hexDigits[c>>4], hexDigits[c&0x0f]
		j += 2
	}
}

// FromProto is the Config of the control plane's resolved tracing (nil:
// no provider, tracing off).
func FromProto(t *waypointapi.Tracing) Config {
	if t == nil || t.GetProvider() == nil {
		return Config{}
	}
	p := t.GetProvider()
	cfg := Config{
		Provider: &Provider{
			Name: p.GetName(), Endpoint: net.JoinHostPort(p.GetService(), strconv.Itoa(int(p.GetPort()))),
			Path: p.GetHttpPath(), ServiceName: t.GetServiceName(), Headers: p.GetHeaders(),
			Timeout: time.Duration(p.GetTimeoutMs()) * time.Millisecond,
		},
		RandomSamplingPercentage: t.GetRandomSamplingPercentage(),
		UseRequestID:             t.GetUseRequestIdForTraceSampling(),
		DisableSpanReporting:     t.GetDisableSpanReporting(),
		MaxPathTagLength:         int(p.GetMaxTagLength()),
	}
	if p.GetProtocol() == waypointapi.TracingProvider_HTTP {
		cfg.Provider.Protocol = HTTP
	}
	if p.GetService() == "" || p.GetPort() == 0 {
		cfg.Provider.Endpoint = ""
	}
	for _, ct := range t.GetCustomTags() {
		tag := CustomTag{Name: ct.GetName(), Default: ct.GetDefaultValue()}
		switch v := ct.GetType().(type) {
		case *waypointapi.CustomTag_Literal:
			tag.Kind, tag.Value = Literal, v.Literal
		case *waypointapi.CustomTag_Header:
			tag.Kind, tag.Value = Header, v.Header
		case *waypointapi.CustomTag_Environment:
			tag.Kind, tag.Value = Environment, v.Environment
		default:
			continue
		}
		cfg.CustomTags = append(cfg.CustomTags, tag)
	}
	return cfg
}
