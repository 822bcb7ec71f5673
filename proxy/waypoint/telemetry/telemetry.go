// Package telemetry is the waypoint's stats filter, the last step of every
// request and TCP stream whatever step answered it: Istio's istio_* metrics
// (reporter="waypoint"), ours for the dashboards, and one access-log line.
package telemetry

import (
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	reqBytes    *prometheus.HistogramVec
	respBytes   *prometheus.HistogramVec
	tcpOpened   *prometheus.CounterVec
	tcpClosed   *prometheus.CounterVec
	tcpSent     *prometheus.CounterVec
	tcpReceived *prometheus.CounterVec
	// Ours, for the dashboards: Istio's labels name no route or policy.
	// Both label values come from the control plane (route and policy
	// names), so they are bounded like Istio's.
	routeRequests *prometheus.CounterVec   // route, response_code
	routeDuration *prometheus.HistogramVec // route
	denials       *prometheus.CounterVec   // policy
}

// durationBuckets are Istio's request duration buckets, in milliseconds.
var durationBuckets = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000}

// byteBuckets are powers of ten from 1 B to 100 MB, Istio's size buckets.
var byteBuckets = prometheus.ExponentialBuckets(1, 10, 9)

func newMetrics() *metrics {
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels []string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	return &metrics{
		requests: counter("istio_requests_total", "Requests handled by the waypoint.", requestLabels),
		duration: histogram("istio_request_duration_milliseconds", "Request duration at the waypoint.",
			durationBuckets, requestLabels),
		reqBytes: histogram("istio_request_bytes",
			"Request size at the waypoint: request line and headers as HTTP/1.1 text, plus the body.", byteBuckets, requestLabels),
		respBytes: histogram("istio_response_bytes",
			"Response size at the waypoint: status line and headers as HTTP/1.1 text, plus the body.", byteBuckets, requestLabels),
		tcpOpened: counter("istio_tcp_connections_opened_total", "TCP streams (HBONE CONNECTs of TCP services) the waypoint accepted.", tcpLabels),
		tcpClosed: counter("istio_tcp_connections_closed_total", "TCP streams the waypoint closed or refused.", tcpLabels),
		tcpSent: counter("istio_tcp_sent_bytes_total",
			"Bytes sent to the client (response direction) on TCP streams, counted when the stream ends.", tcpLabels),
		tcpReceived: counter("istio_tcp_received_bytes_total",
			"Bytes received from the client (request direction) on TCP streams, counted when the stream ends.", tcpLabels),
		routeRequests: counter("ztunnel_waypoint_route_requests_total",
			"Requests by the route that took them (\"-\" for none) and response code.", []string{"route", "response_code"}),
		routeDuration: histogram("ztunnel_waypoint_route_duration_milliseconds", "Request duration by the route that took it.",
			durationBuckets, []string{"route"}),
		denials: counter("ztunnel_waypoint_authorization_denials_total",
			"Requests and connections denied, by the policy that denied them (\"-\" for the default deny).", []string{"policy"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.duration, m.reqBytes, m.respBytes,
		m.tcpOpened, m.tcpClosed, m.tcpSent, m.tcpReceived, m.routeRequests, m.routeDuration, m.denials}
}

// Recorder is the stats step of one waypoint: its metrics and its access
// log.
type Recorder struct {
	m      *metrics
	series *seriesCache
	access *zap.Logger
	// lines, when set, writes the access lines instead of access (the
	// same bytes, without zap's per-field work); see UseJSONLines.
	lines *daemon.JSONLines
	log   *zap.Logger

	// gen counts the Activates that deleted series, from 1. A request
	// served under an earlier generation counts no metrics: its overrides
	// are no longer in force, and counting would bring back a series the
	// change deleted (a disabled metric back in /metrics for good).
	gen atomic.Uint64

	mu     sync.Mutex
	active [nFam]string           // Activate: the waypoint-wide overrides in force
	files  map[string]*os.File    // access log files by path, opened once
	otel   map[string]*otelExport // OTLP log exporters by collector and logger name
	warned map[string]bool
}

// New registers the metrics with reg (nil: not registered) and writes the
// access log to access. The series are bounded by lim (see Limits).
func New(reg prometheus.Registerer, access *zap.Logger, lim Limits) (*Recorder, error) {
	if lim.Idle <= 0 {
		lim.Idle = DefaultIdle
	}
	if lim.Max <= 0 {
		lim.Max = DefaultMaxSeries
	}
	m := newMetrics()
	c := &seriesCache{limits: lim, now: time.Now, m: m, http: map[httpKey]*httpSeries{}, tcp: map[tcpMapKey]*tcpSeries{}}
	if reg != nil {
		for _, col := range append(m.collectors(), sweeper{c}) {
			if err := reg.Register(col); err != nil {
				return nil, err
			}
		}
	}
	rec := &Recorder{m: m, series: c, access: access, log: access, files: map[string]*os.File{}, otel: map[string]*otelExport{}, warned: map[string]bool{}}
	rec.gen.Store(1)
	return rec, nil
}

// Peer names one end of a request for Istio's labels. Every value comes
// from the control plane (the workload API) or from a verified
// certificate; "" is rendered as Istio renders a missing value.
type Peer struct {
	Workload, Namespace string
	// Principal is the SPIFFE URI ("spiffe://td/ns/x/sa/y").
	Principal                           string
	CanonicalService, CanonicalRevision string
	Cluster                             string
}

// Entry is what the stats step reads of one request (one TCP stream): what
// the earlier steps filled in, and the outcome.
type Entry struct {
	Src, Dst netip.AddrPort
	Peer     identity.Identity
	// Source is the client workload (from the workload API by address, or
	// from baggage its certificate's namespace vouches for); Destination
	// the endpoint the request went to (zero: none was picked).
	Source, Destination Peer
	// ServiceName and ServiceNamespace name the bound service addressed
	// ("": a workload was).
	ServiceName, ServiceNamespace string
	Attrs                         *stream.Attrs
	Req                           *http.Request
	// GRPCStatus is the response's grpc-status (trailer, or header of a
	// trailers-only response); "" when none was seen.
	GRPCStatus              string
	Verdict                 *stream.Verdict
	Route, Upstream, Mirror string
	// UpstreamTo is where the request went. When it is valid, Upstream
	// says only how ("hbone"), and the access log writes the two as one
	// field ("hbone 10.0.0.2:8080") without making that string for each
	// request.
	UpstreamTo netip.AddrPort
	Err        error
	// Code is the status answered; Flags Envoy's response flags ("": none).
	Code     int
	Flags    string
	Duration time.Duration
	Sizes    Sizes
	// Telemetry is the Telemetry API configuration of the request (the
	// service's, else the waypoint's); nil: the default.
	Telemetry *Config
	// Generation is what Activate returned for the configuration the
	// request was served under; 0: not tracked (every generation).
	Generation uint64
}

// Stream is one accepted TCP stream's report: Done adds its bytes and
// counts it closed.
type Stream struct {
	rec  *Recorder
	s    *tcpSeries
	more []*tcpSeries // further groups under Telemetry overrides
	once sync.Once
}

// Done counts the stream closed with received bytes from the client and
// sent bytes to it. Calls after the first do nothing.
func (st *Stream) Done(received, sent int64) {
	if st == nil {
		return
	}
	st.once.Do(func() {
		st.done(st.s, received, sent)
		for _, s := range st.more {
			st.done(s, received, sent)
		}
	})
}

func (st *Stream) done(s *tcpSeries, received, sent int64) {
	if s == nil {
		return
	}
	if s.received != nil {
		s.received.Add(float64(max(received, 0)))
	}
	if s.sent != nil {
		s.sent.Add(float64(max(sent, 0)))
	}
	if s.closed != nil {
		s.closed.Inc()
	}
	st.rec.series.release(s)
}

// protocol is Istio's request_protocol: "grpc" for a gRPC content type
// (whatever the HTTP version, as Envoy's isGrpcRequestHeaders), "http"
// for other HTTP, "tcp" for a TCP stream.
func protocol(ex *Entry) string {
	switch {
	case !ex.Attrs.HTTP:
		return "tcp"
	case ex.Req != nil && IsGRPC(ex.Req.Header.Get("content-type")):
		return "grpc"
	}
	return "http"
}

// tcpLabelValues fills k with the Istio labels shared by both families.
func tcpLabelValues(k *tcpKey, ex *Entry, proto, flags string) {
	src, dst := &ex.Source, &ex.Destination
	// The source namespace is the certificate's, as Envoy takes it from
	// the peer SAN first.
	srcNs := ex.Peer.Namespace
	if srcNs == "" {
		srcNs = src.Namespace
	}
	svcName, svcNs := "unknown", "unknown"
	if ex.ServiceName != "" || ex.ServiceNamespace != "" {
		svcName, svcNs = orUnknown(ex.ServiceName), orUnknown(ex.ServiceNamespace)
	}
	*k = tcpKey{
		"waypoint",
		orUnknown(src.Workload), orUnknown(src.CanonicalService), orDefault(src.CanonicalRevision, "latest"),
		orUnknown(srcNs), orUnknown(src.Principal), orUnknown(src.CanonicalService), orUnknown(src.CanonicalRevision),
		orUnknown(src.Cluster),
		orUnknown(dst.Workload), orUnknown(dst.Namespace), orUnknown(dst.Principal),
		orUnknown(dst.CanonicalService), orUnknown(dst.CanonicalRevision), orUnknown(ex.Attrs.Service),
		orUnknown(dst.CanonicalService), orUnknown(dst.CanonicalRevision),
		svcName, svcNs, orUnknown(dst.Cluster),
		proto, flags, "mutual_tls", // every client of the waypoint presented a certificate (HBONE)
	}
}

// Record is the stats step: one metric sample and one access-log line per
// request. For a TCP stream it counts the stream opened and returns its
// Stream, whose Done reports the bytes and the close; a TCP stream that
// was refused (Code other than 200) is counted opened and closed at once,
// as Envoy counts a connection that ends before its peer is known, and
// Record returns nil.
func (rec *Recorder) Record(ex *Entry) *Stream {
	code, flags := ex.Code, ex.Flags
	proto := protocol(ex)
	if flags == "" {
		flags = "-"
	}
	st := rec.count(ex, proto, flags)
	// A 403 that authorization decided (not "NR", a destination not bound
	// here).
	if code == http.StatusForbidden && flags != "NR" && !ex.Verdict.Allow {
		policy := ex.Verdict.Policy
		if policy == "" {
			policy = "-"
		}
		rec.m.denials.WithLabelValues(policy).Inc()
	}
	rec.logLine(ex, proto, code, flags, ex.Duration, ex.Sizes)
	if c := ex.Telemetry; c != nil && len(c.logs) > 0 && c.logged(ex) {
		for _, s := range c.logs {
			s.write(ex, proto, flags)
		}
	}
	return st
}

// count is Record's metrics: the series of ex's label set, found without
// allocating once the label set was seen (TestCountAllocs).
func (rec *Recorder) count(ex *Entry, proto, flags string) *Stream {
	if g := ex.Generation; g != 0 && g != rec.gen.Load() {
		return nil
	}
	if c := ex.Telemetry; c != nil && c.custom {
		return rec.countCustom(ex, proto, flags, c)
	}
	code, d, sizes := ex.Code, ex.Duration, ex.Sizes
	var st *Stream
	if ex.Attrs.HTTP {
		route := ex.Route
		if route == "" {
			route = "-"
		}
		var k httpKey
		tcpLabelValues((*tcpKey)(k.lv[:nTCP]), ex, proto, flags)
		k.lv[iCode] = codeLabel(code)
		if proto == "grpc" {
			k.lv[iCode+1] = grpcStatusLabel(ex.GRPCStatus, code)
		}
		k.route = route
		ms := float64(d.Microseconds()) / 1000
		hs := rec.series.httpFor(&k)
		hs.requests.Inc()
		hs.duration.Observe(ms)
		hs.reqBytes.Observe(float64(sizes.Request))
		hs.respBytes.Observe(float64(sizes.Response))
		hs.routeRequests.Inc()
		hs.routeDuration.Observe(ms)
	} else {
		var k tcpKey
		tcpLabelValues(&k, ex, proto, flags)
		ts := rec.series.tcpFor(&k, 0)
		ts.opened.Inc()
		st = &Stream{rec: rec, s: ts}
		if code != http.StatusOK {
			st.Done(0, 0)
			st = nil
		}
	}
	return st
}

// countCustom is count under Telemetry overrides: one series lookup per
// group of families that share their label set; disabled families are
// not counted.
func (rec *Recorder) countCustom(ex *Entry, proto, flags string, c *Config) *Stream {
	code, d, sizes := ex.Code, ex.Duration, ex.Sizes
	if ex.Attrs.HTTP {
		route := ex.Route
		if route == "" {
			route = "-"
		}
		var base httpKey
		tcpLabelValues((*tcpKey)(base.lv[:nTCP]), ex, proto, flags)
		base.lv[iCode] = codeLabel(code)
		if proto == "grpc" {
			base.lv[iCode+1] = grpcStatusLabel(ex.GRPCStatus, code)
		}
		base.route = route
		ms := float64(d.Microseconds()) / 1000
		for i := range c.httpGroups {
			g := &c.httpGroups[i]
			k := base
			apply(k.lv[:], g.ops, ex)
			k.mask = g.mask
			hs := rec.series.httpFor(&k)
			if hs.requests != nil {
				hs.requests.Inc()
			}
			if hs.duration != nil {
				hs.duration.Observe(ms)
			}
			if hs.reqBytes != nil {
				hs.reqBytes.Observe(float64(sizes.Request))
			}
			if hs.respBytes != nil {
				hs.respBytes.Observe(float64(sizes.Response))
			}
			if hs.routeRequests != nil {
				hs.routeRequests.Inc()
				hs.routeDuration.Observe(ms)
			}
		}
		return nil
	}
	var base tcpKey
	tcpLabelValues(&base, ex, proto, flags)
	st := &Stream{rec: rec}
	for i := range c.tcpGroups {
		g := &c.tcpGroups[i]
		k := base
		apply(k[:], g.ops, ex)
		ts := rec.series.tcpFor(&k, g.mask)
		if ts.opened != nil {
			ts.opened.Inc()
		}
		if st.s == nil {
			st.s = ts
		} else {
			st.more = append(st.more, ts)
		}
	}
	if code != http.StatusOK || st.s == nil {
		st.Done(0, 0)
		return nil
	}
	return st
}

// logFields lends logLine its field slices (a cache: no state).
var logFields = sync.Pool{New: func() any { f := make([]zap.Field, 0, 24); return &f }}

// UseJSONLines makes the access log's lines come from j, which writes what
// the access logger (a daemon.NewLogger JSON logger) would write for them,
// at a third of its cost (daemon.BenchmarkAccessLine). Call before the
// first request. A line with an error still goes through the access
// logger: zap adds an error's verbose form and causes when it has them.
func (rec *Recorder) UseJSONLines(j *daemon.JSONLines) { rec.lines = j }

func (rec *Recorder) logLine(ex *Entry, proto string, code int, flags string, d time.Duration, sizes Sizes) {
	if rec.lines != nil && ex.Err == nil {
		if rec.lines.Enabled() {
			l := rec.lines.Info("request")
			accessFields(jsonSink{l}, ex, proto, code, flags, d, sizes)
			l.Write()
		}
		return
	}
	// Room for every field, from a pool: 24 fields are 1.5 KiB a request,
	// a quarter of what the fast path allocated at 1k req/s
	// (bench/waypoint). zap encodes them before Info returns.
	fp := logFields.Get().(*[]zap.Field)
	defer func() { clear((*fp)[:cap(*fp)]); logFields.Put(fp) }()
	*fp = (*fp)[:0]
	accessFields(zapSink{fp}, ex, proto, code, flags, d, sizes)
	if ex.Err != nil {
		*fp = append(*fp, zap.Error(ex.Err))
	}
	rec.access.Info("request", *fp...)
}

// accessFields is the one list of an access line's fields, in order, for
// either writer.
func accessFields(l lineSink, ex *Entry, proto string, code int, flags string, d time.Duration, sizes Sizes) {
	l.addr("src.addr", ex.Src)
	l.str("src.identity", ex.peerPrincipal())
	l.str("src.workload", ex.Source.Workload)
	l.addr("dst.addr", ex.Dst)
	l.str("dst.service", ex.Attrs.Service)
	l.str("dst.workload", ex.Destination.Workload)
	if ex.UpstreamTo.IsValid() {
		l.via("upstream", ex.Upstream, ex.UpstreamTo)
	} else {
		l.str("upstream", ex.Upstream)
	}
	l.str("protocol", proto)
	l.i64("code", int64(code))
	l.str("flags", flags)
	l.dur("duration", d)
	if ex.Attrs.HTTP {
		l.str("method", ex.Attrs.Method)
		l.str("path", ex.Attrs.Path)
		l.str("host", ex.Attrs.Host)
		l.str("route", ex.Route)
		l.i64("bytes.request", sizes.Request)
		l.i64("bytes.response", sizes.Response)
	}
	if ex.Verdict.Policy != "" || !ex.Verdict.Allow {
		l.str("authz.policy", ex.Verdict.Policy)
		l.boolean("authz.allow", ex.Verdict.Allow)
	}
	if ex.Attrs.Auth != nil {
		l.str("request.principal", ex.Attrs.Auth.Principal)
	}
	if ex.Mirror != "" {
		l.str("mirror", ex.Mirror)
	}
	if ex.Verdict.Reason != "" {
		l.str("authz.reason", ex.Verdict.Reason)
	}
	if len(ex.Verdict.DryRun) > 0 {
		l.strs("authz.dry_run", ex.Verdict.DryRun)
	}
}

// lineSink takes an access line's fields: zap fields for the access
// logger (zapSink) or a daemon.JSONLine (jsonSink).
type lineSink interface {
	str(k, v string)
	addr(k string, a netip.AddrPort)
	i64(k string, v int64)
	boolean(k string, v bool)
	dur(k string, d time.Duration)
	strs(k string, v []string)
	// via is the string field "how a" (a alone when how is "").
	via(k, how string, a netip.AddrPort)
}

type zapSink struct{ f *[]zap.Field }

func (z zapSink) str(k, v string)                     { *z.f = append(*z.f, zap.String(k, v)) }
func (z zapSink) addr(k string, a netip.AddrPort)     { *z.f = append(*z.f, zap.String(k, a.String())) }
func (z zapSink) i64(k string, v int64)               { *z.f = append(*z.f, zap.Int64(k, v)) }
func (z zapSink) boolean(k string, v bool)            { *z.f = append(*z.f, zap.Bool(k, v)) }
func (z zapSink) dur(k string, d time.Duration)       { *z.f = append(*z.f, zap.Duration(k, d)) }
func (z zapSink) strs(k string, v []string)           { *z.f = append(*z.f, zap.Strings(k, v)) }
func (z zapSink) via(k, how string, a netip.AddrPort) { z.str(k, upstreamText(how, a)) }

type jsonSink struct{ l *daemon.JSONLine }

func (j jsonSink) str(k, v string)                 { j.l.String(k, v) }
func (j jsonSink) addr(k string, a netip.AddrPort) { j.l.AddrPort(k, a) }
func (j jsonSink) i64(k string, v int64)           { j.l.Int(k, v) }
func (j jsonSink) boolean(k string, v bool)        { j.l.Bool(k, v) }
func (j jsonSink) dur(k string, d time.Duration)   { j.l.Duration(k, d) }
func (j jsonSink) strs(k string, v []string)       { j.l.Strings(k, v) }
func (j jsonSink) via(k, how string, a netip.AddrPort) {
	if how == "" {
		j.l.AddrPort(k, a)
		return
	}
	j.l.AddrPortAfter(k, how, a)
}

// grpcStatusLabel is grpc_response_status of a gRPC request: the
// response's grpc-status, else its HTTP status mapped as gRPC maps it
// (as Envoy's Grpc::Common::getGrpcStatus does with the stream info, so a
// plain-HTTP refusal such as the waypoint's 403 still has one).
func grpcStatusLabel(status string, code int) string {
	if status != "" {
		return status
	}
	switch code {
	case http.StatusBadRequest:
		return "13" // INTERNAL
	case http.StatusUnauthorized:
		return "16" // UNAUTHENTICATED
	case http.StatusForbidden:
		return "7" // PERMISSION_DENIED
	case http.StatusNotFound:
		return "12" // UNIMPLEMENTED
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return "14" // UNAVAILABLE
	}
	return "2" // UNKNOWN
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// IsGRPC reports whether a content type is gRPC's.
func IsGRPC(ct string) bool { return len(ct) >= 16 && ct[:16] == "application/grpc" }

// Sizes are one request's and its response's sizes (zero for TCP):
// Request and Response whole messages, head and body, for the byte
// histograms (as Istio's stats filter counts them); RequestBody and
// ResponseBody the bodies alone, for Envoy's %BYTES_RECEIVED% and
// %BYTES_SENT% and the request_size/response_size span tags.
type Sizes struct{ Request, Response, RequestBody, ResponseBody int64 }

// HeaderBytes is the size of a header block written as HTTP/1.1 text:
// "Name: value\r\n" per value and the blank line that ends it.
func HeaderBytes(h http.Header) int64 {
	n := int64(2)
	for k, vs := range h {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	return n
}

// upstreamText is the access line's upstream as one string: "how a", or
// a alone when how is "" (what jsonSink.via writes in place).
func upstreamText(how string, a netip.AddrPort) string {
	if how == "" {
		return a.String()
	}
	return how + " " + a.String()
}

// UpstreamAddress is the upstream host's ip:port, as Envoy's
// %UPSTREAM_HOST% and its spans' upstream_address give it: UpstreamTo
// when valid, else Upstream.
func (ex *Entry) UpstreamAddress() string {
	if ex.UpstreamTo.IsValid() {
		return ex.UpstreamTo.String()
	}
	return ex.Upstream
}

// peerPrincipal is Peer.String(), taken from Source.Principal when that is
// the same URI (the waypoint's decide step sets it so) rather than made
// again for every access line.
func (ex *Entry) peerPrincipal() string {
	if p := ex.Source.Principal; p != "" && !ex.Peer.IsZero() && isPrincipalOf(p, ex.Peer) {
		return p
	}
	return ex.Peer.String()
}

// isPrincipalOf reports whether p is id's SPIFFE URI.
func isPrincipalOf(p string, id identity.Identity) bool {
	for _, part := range [...]string{"spiffe://", id.TrustDomain, "/ns/", id.Namespace, "/sa/", id.ServiceAccount} {
		if !strings.HasPrefix(p, part) {
			return false
		}
		p = p[len(part):]
	}
	return p == ""
}
