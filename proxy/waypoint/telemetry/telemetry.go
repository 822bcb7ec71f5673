// Package telemetry is the waypoint's stats filter, the last step of every
// request and TCP stream whatever step answered it: Istio's istio_* metrics
// (reporter="waypoint"), ours for the dashboards, and one access-log line.
package telemetry

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// Istio's request metrics, reporter="waypoint". Every label value comes from
// the control plane (workload API names, identities from certificates) or
// from a bounded set (protocol, response code, flags), never from request
// headers, so the series count is bounded by the mesh.
var requestLabels = []string{
	"reporter", "source_workload", "source_workload_namespace", "source_principal",
	"destination_service", "destination_service_name", "destination_service_namespace",
	"destination_workload", "destination_workload_namespace", "destination_principal",
	"request_protocol", "response_code", "response_flags", "connection_security_policy",
}

type metrics struct {
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	reqBytes  *prometheus.HistogramVec
	respBytes *prometheus.HistogramVec
	tcpOpen   *prometheus.CounterVec
	// Ours, for the dashboards: Istio's labels name no route or policy.
	// Both label values come from the control plane (route and policy
	// names), so they are bounded like Istio's.
	routeRequests *prometheus.CounterVec   // route, response_code
	routeDuration *prometheus.HistogramVec // route
	denials       *prometheus.CounterVec   // policy
	// series caches httpSeries by label tuple (string → *httpSeries).
	series sync.Map
}

// httpSeries are the series one HTTP request updates, looked up once per
// label tuple and kept: WithLabelValues hashes and compares every label on
// each call, and six calls per request were ~4 % of the waypoint's CPU at
// 1k req/s (bench/waypoint). The tuples are bounded as the series are
// (control-plane values), and no series is ever deleted.
type httpSeries struct {
	requests, routeRequests                      prometheus.Counter
	duration, reqBytes, respBytes, routeDuration prometheus.Observer
}

// httpSeriesFor returns the series of the Istio labels lv and route.
func (m *metrics) httpSeriesFor(lv []string, route string) *httpSeries {
	var b strings.Builder
	n := len(route)
	for _, v := range lv {
		n += len(v) + 1
	}
	b.Grow(n)
	for _, v := range lv {
		b.WriteString(v)
		b.WriteByte(0)
	}
	b.WriteString(route)
	key := b.String()
	if s, ok := m.series.Load(key); ok {
		return s.(*httpSeries)
	}
	s := &httpSeries{
		requests:      m.requests.WithLabelValues(lv...),
		duration:      m.duration.WithLabelValues(lv...),
		reqBytes:      m.reqBytes.WithLabelValues(lv...),
		respBytes:     m.respBytes.WithLabelValues(lv...),
		routeRequests: m.routeRequests.WithLabelValues(route, lv[11]),
		routeDuration: m.routeDuration.WithLabelValues(route),
	}
	v, _ := m.series.LoadOrStore(key, s)
	return v.(*httpSeries)
}

// durationBuckets are Istio's request duration buckets, in milliseconds.
var durationBuckets = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000}

// byteBuckets are powers of ten from 1 B to 100 MB, Istio's size buckets.
var byteBuckets = prometheus.ExponentialBuckets(1, 10, 9)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_requests_total", Help: "Requests handled by the waypoint.",
		}, requestLabels),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "istio_request_duration_milliseconds", Help: "Request duration at the waypoint.",
			Buckets: durationBuckets,
		}, requestLabels),
		reqBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "istio_request_bytes", Help: "Request size at the waypoint: request line and headers as HTTP/1.1 text, plus the body.",
			Buckets: byteBuckets,
		}, requestLabels),
		respBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "istio_response_bytes", Help: "Response size at the waypoint: status line and headers as HTTP/1.1 text, plus the body.",
			Buckets: byteBuckets,
		}, requestLabels),
		tcpOpen: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_tcp_connections_opened_total", Help: "TCP connections the waypoint accepted.",
		}, requestLabels),
		routeRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ztunnel_waypoint_route_requests_total", Help: "Requests by the route that took them (\"-\" for none) and response code.",
		}, []string{"route", "response_code"}),
		routeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ztunnel_waypoint_route_duration_milliseconds", Help: "Request duration by the route that took it.",
			Buckets: durationBuckets,
		}, []string{"route"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ztunnel_waypoint_authorization_denials_total", Help: "Requests and connections denied, by the policy that denied them (\"-\" for the default deny).",
		}, []string{"policy"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.duration, m.reqBytes, m.respBytes, m.tcpOpen,
			m.routeRequests, m.routeDuration, m.denials} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// Recorder is the stats step of one waypoint: its metrics and its access
// log.
type Recorder struct {
	m      *metrics
	access *zap.Logger
}

// New registers the metrics with reg (nil: not registered) and writes the
// access log to access.
func New(reg prometheus.Registerer, access *zap.Logger) (*Recorder, error) {
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Recorder{m: m, access: access}, nil
}

// Entry is what the stats step reads of one request (one TCP stream): what
// the earlier steps filled in, and the outcome.
type Entry struct {
	Src, Dst    netip.AddrPort
	Peer        identity.Identity
	SrcWorkload string
	// ServiceName and ServiceNamespace name the bound service addressed
	// ("": a workload was).
	ServiceName, ServiceNamespace string
	Attrs                         *stream.Attrs
	// H2 and Req tell gRPC (HTTP/2 with a gRPC content type) from HTTP.
	H2                                      bool
	Req                                     *http.Request
	Verdict                                 *stream.Verdict
	Route, Upstream, Mirror                 string
	DstWorkload, DstNamespace, DstPrincipal string
	Err                                     error
	// Code is the status answered; Flags Envoy's response flags ("": none).
	Code     int
	Flags    string
	Duration time.Duration
	Sizes    Sizes
}

// Record is the stats step: one metric sample and one access-log line per
// request (per connection for TCP).
func (rec *Recorder) Record(ex *Entry) {
	code, flags, d, sizes := ex.Code, ex.Flags, ex.Duration, ex.Sizes
	proto := "http"
	switch {
	case !ex.Attrs.HTTP:
		proto = "tcp"
	case ex.H2:
		proto = "grpc"
		if ex.Req == nil || ex.Req.Header.Get("content-type") == "" || !IsGRPC(ex.Req.Header.Get("content-type")) {
			proto = "http"
		}
	}
	if flags == "" {
		flags = "-"
	}
	svcName, svcNs := "unknown", "unknown"
	if ex.ServiceName != "" || ex.ServiceNamespace != "" {
		svcName, svcNs = ex.ServiceName, ex.ServiceNamespace
	}
	lv := []string{
		"waypoint", orUnknown(ex.SrcWorkload), orUnknown(ex.Peer.Namespace), orUnknown(ex.Attrs.Principal),
		orUnknown(ex.Attrs.Service), svcName, svcNs,
		orUnknown(ex.DstWorkload), orUnknown(ex.DstNamespace), orUnknown(ex.DstPrincipal),
		proto, strconv.Itoa(code), flags, "mutual_tls",
	}
	m := rec.m
	if ex.Attrs.HTTP {
		route := ex.Route
		if route == "" {
			route = "-"
		}
		ms := float64(d.Microseconds()) / 1000
		hs := m.httpSeriesFor(lv, route)
		hs.requests.Inc()
		hs.duration.Observe(ms)
		hs.reqBytes.Observe(float64(sizes.Request))
		hs.respBytes.Observe(float64(sizes.Response))
		hs.routeRequests.Inc()
		hs.routeDuration.Observe(ms)
	} else {
		m.tcpOpen.WithLabelValues(lv...).Inc()
	}
	// A 403 that authorization decided (not "NR", a destination not bound
	// here).
	if code == http.StatusForbidden && flags != "NR" && !ex.Verdict.Allow {
		policy := ex.Verdict.Policy
		if policy == "" {
			policy = "-"
		}
		m.denials.WithLabelValues(policy).Inc()
	}
	// Room for every field below: one allocation, no regrowth.
	fields := append(make([]zap.Field, 0, 24),
		zap.String("src.addr", ex.Src.String()), zap.String("src.identity", ex.Peer.String()),
		zap.String("src.workload", ex.SrcWorkload),
		zap.String("dst.addr", ex.Dst.String()), zap.String("dst.service", ex.Attrs.Service),
		zap.String("dst.workload", ex.DstWorkload), zap.String("upstream", ex.Upstream),
		zap.String("protocol", proto), zap.Int("code", code), zap.String("flags", flags),
		zap.Duration("duration", d),
	)
	if ex.Attrs.HTTP {
		fields = append(fields, zap.String("method", ex.Attrs.Method), zap.String("path", ex.Attrs.Path),
			zap.String("host", ex.Attrs.Host), zap.String("route", ex.Route),
			zap.Int64("bytes.request", sizes.Request), zap.Int64("bytes.response", sizes.Response))
	}
	if ex.Verdict.Policy != "" || !ex.Verdict.Allow {
		fields = append(fields, zap.String("authz.policy", ex.Verdict.Policy), zap.Bool("authz.allow", ex.Verdict.Allow))
	}
	if ex.Attrs.Auth != nil {
		fields = append(fields, zap.String("request.principal", ex.Attrs.Auth.Principal))
	}
	if ex.Mirror != "" {
		fields = append(fields, zap.String("mirror", ex.Mirror))
	}
	if ex.Verdict.Reason != "" {
		fields = append(fields, zap.String("authz.reason", ex.Verdict.Reason))
	}
	if len(ex.Verdict.DryRun) > 0 {
		fields = append(fields, zap.Strings("authz.dry_run", ex.Verdict.DryRun))
	}
	if ex.Err != nil {
		fields = append(fields, zap.Error(ex.Err))
	}
	rec.access.Info("request", fields...)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// IsGRPC reports whether a content type is gRPC's.
func IsGRPC(ct string) bool { return len(ct) >= 16 && ct[:16] == "application/grpc" }

// Sizes are one request's and its response's sizes for the byte
// histograms (zero for TCP).
type Sizes struct{ Request, Response int64 }

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
