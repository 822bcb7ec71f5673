package dnsproxy

import (
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// dnsLabels are the labels of every istio_dns_* metric (reference §8.1).
var dnsLabels = []string{"request_query_type", "request_protocol", "source_canonical_service", "source_canonical_revision"}

// Metrics are the DNS proxy's metrics. Create them once per process with
// NewMetrics and share them between every pod's Server.
type Metrics struct {
	requests         *prometheus.CounterVec
	upstreamRequests *prometheus.CounterVec
	upstreamFailures *prometheus.CounterVec
	upstreamDuration *prometheus.HistogramVec
}

// NewMetrics registers the istio_dns_* metrics with reg (nil: not
// registered, for tests and programs that do not scrape).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_dns_requests_total", Help: "Total number of DNS requests.",
		}, dnsLabels),
		upstreamRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_dns_upstream_requests_total", Help: "Total number of DNS requests forwarded to the upstream resolvers.",
		}, dnsLabels),
		upstreamFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_dns_upstream_failures_total", Help: "Total number of forwarded DNS requests that got no upstream answer.",
		}, dnsLabels),
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "istio_dns_upstream_request_duration_seconds",
			Help:    "Duration of forwarded DNS requests, including failed ones.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
		}, dnsLabels),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.upstreamRequests, m.upstreamFailures, m.upstreamDuration)
	}
	return m
}

// labelValues are one request's label values.
type labelValues [4]string

func newLabels(qtype uint16, proto string, client *state.Workload) labelValues {
	l := labelValues{qtypeLabel(qtype), proto, "unknown", "unknown"}
	if client != nil {
		if client.CanonicalName != "" {
			l[2] = client.CanonicalName
		}
		if client.CanonicalRevision != "" {
			l[3] = client.CanonicalRevision
		}
	}
	return l
}

// qtypeLabel is the query type in lower case, as ztunnel reports it ("a",
// "aaaa", "srv"); unassigned types are "other".
func qtypeLabel(t uint16) string {
	switch t {
	case dns.TypeA:
		return "a"
	case dns.TypeAAAA:
		return "aaaa"
	case 0:
		return "unknown"
	}
	if s, ok := dns.TypeToString[t]; ok {
		return strings.ToLower(s)
	}
	return "other" // bounded label cardinality
}

func (m *Metrics) request(l labelValues) {
	if m != nil {
		m.requests.WithLabelValues(l[:]...).Inc()
	}
}

func (m *Metrics) upstream(l labelValues, d time.Duration, failed bool) {
	if m == nil {
		return
	}
	m.upstreamRequests.WithLabelValues(l[:]...).Inc()
	m.upstreamDuration.WithLabelValues(l[:]...).Observe(d.Seconds())
	if failed {
		m.upstreamFailures.WithLabelValues(l[:]...).Inc()
	}
}
