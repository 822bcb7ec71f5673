package waypoint

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
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

// record is the stats step: one metric sample and one access-log line per
// request (per connection for TCP).
func (w *Waypoint) record(ex *exchange, code int, flags string, d time.Duration, sizes byteSizes) {
	proto := "http"
	switch {
	case !ex.attrs.HTTP:
		proto = "tcp"
	case ex.h2:
		proto = "grpc"
		if ex.req == nil || ex.req.Header.Get("content-type") == "" || !isGRPC(ex.req.Header.Get("content-type")) {
			proto = "http"
		}
	}
	if flags == "" {
		flags = "-"
	}
	svcName, svcNs := "unknown", "unknown"
	if ex.svc != nil {
		svcName, svcNs = ex.svc.name, ex.svc.namespace
	}
	lv := []string{
		"waypoint", orUnknown(ex.srcWorkload), orUnknown(ex.peer.Namespace), orUnknown(ex.attrs.Principal),
		orUnknown(ex.attrs.Service), svcName, svcNs,
		orUnknown(ex.dstWorkload), orUnknown(ex.dstNamespace), orUnknown(ex.dstPrincipal),
		proto, strconv.Itoa(code), flags, "mutual_tls",
	}
	if ex.attrs.HTTP {
		route := ex.route
		if route == "" {
			route = "-"
		}
		ms := float64(d.Microseconds()) / 1000
		hs := w.metrics.httpSeriesFor(lv, route)
		hs.requests.Inc()
		hs.duration.Observe(ms)
		hs.reqBytes.Observe(float64(sizes.request))
		hs.respBytes.Observe(float64(sizes.response))
		hs.routeRequests.Inc()
		hs.routeDuration.Observe(ms)
	} else {
		w.metrics.tcpOpen.WithLabelValues(lv...).Inc()
	}
	// A 403 that authorization decided (not "NR", a destination not bound
	// here).
	if code == http.StatusForbidden && flags != "NR" && !ex.verdict.Allow {
		policy := ex.verdict.Policy
		if policy == "" {
			policy = "-"
		}
		w.metrics.denials.WithLabelValues(policy).Inc()
	}
	// Room for every field below: one allocation, no regrowth.
	fields := append(make([]zap.Field, 0, 24),
		zap.String("src.addr", ex.src.String()), zap.String("src.identity", ex.peer.String()),
		zap.String("src.workload", ex.srcWorkload),
		zap.String("dst.addr", ex.dst.String()), zap.String("dst.service", ex.attrs.Service),
		zap.String("dst.workload", ex.dstWorkload), zap.String("upstream", ex.upstream),
		zap.String("protocol", proto), zap.Int("code", code), zap.String("flags", flags),
		zap.Duration("duration", d),
	)
	if ex.attrs.HTTP {
		fields = append(fields, zap.String("method", ex.attrs.Method), zap.String("path", ex.attrs.Path),
			zap.String("host", ex.attrs.Host), zap.String("route", ex.route),
			zap.Int64("bytes.request", sizes.request), zap.Int64("bytes.response", sizes.response))
	}
	if ex.verdict.Policy != "" || !ex.verdict.Allow {
		fields = append(fields, zap.String("authz.policy", ex.verdict.Policy), zap.Bool("authz.allow", ex.verdict.Allow))
	}
	if ex.attrs.Auth != nil {
		fields = append(fields, zap.String("request.principal", ex.attrs.Auth.Principal))
	}
	if ex.mirror != "" {
		fields = append(fields, zap.String("mirror", ex.mirror))
	}
	if ex.verdict.Reason != "" {
		fields = append(fields, zap.String("authz.reason", ex.verdict.Reason))
	}
	if len(ex.verdict.DryRun) > 0 {
		fields = append(fields, zap.Strings("authz.dry_run", ex.verdict.DryRun))
	}
	if ex.err != nil {
		fields = append(fields, zap.Error(ex.err))
	}
	w.access.Info("request", fields...)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func isGRPC(ct string) bool { return len(ct) >= 16 && ct[:16] == "application/grpc" }

// byteSizes are one request's and its response's sizes for the byte
// histograms (zero for TCP).
type byteSizes struct{ request, response int64 }

// headerBytes is the size of a header block written as HTTP/1.1 text:
// "Name: value\r\n" per value and the blank line that ends it.
func headerBytes(h http.Header) int64 {
	n := int64(2)
	for k, vs := range h {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	return n
}
