package proxy

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Label names of the istio_tcp_* family, in Istio's order (docs/protocol.md#metrics).
var tcpLabels = []string{
	"reporter",
	"source_workload", "source_canonical_service", "source_canonical_revision", "source_workload_namespace",
	"source_principal", "source_app", "source_version", "source_cluster",
	"destination_service", "destination_service_namespace", "destination_service_name",
	"destination_workload", "destination_canonical_service", "destination_canonical_revision",
	"destination_workload_namespace", "destination_principal", "destination_app", "destination_version",
	"destination_cluster",
	"request_protocol", "response_flags", "connection_security_policy",
	"source_region", "source_zone", "destination_region", "destination_zone",
}

// Metrics are the node proxy's connection metrics. Create them once per
// process with NewMetrics and share them between every pod's listeners.
type Metrics struct {
	opened   *prometheus.CounterVec
	closed   *prometheus.CounterVec
	sent     *prometheus.CounterVec
	received *prometheus.CounterVec
	failed   *prometheus.CounterVec
	open     *prometheus.GaugeVec
	// openGauge is open's series per Direction, resolved once.
	openGauge [2]prometheus.Gauge
	// openNow is open's sum over its reporters, for Open; started counts
	// every connection, for Started.
	openNow, started atomic.Int64
	// dryRun: see dryRunDecision (dryrun.go).
	dryRun *prometheus.CounterVec
	// denials: see denied (dryrun.go).
	denials *prometheus.CounterVec

	flushEvery time.Duration
	live       liveSet
}

// Open returns the connections open now, both directions (the sum of
// istio_tcp_sockets_open), without a registry read.
func (m *Metrics) Open() int64 { return m.openNow.Load() }

// Started returns how many connections have started so far, both
// directions: every NewResult.
func (m *Metrics) Started() int64 { return m.started.Load() }

// NewMetrics registers the istio_tcp_* metrics with reg (nil: not registered,
// for tests that do not scrape). Open connections' bytes are flushed every
// DefaultFlushInterval unless an option says otherwise.
func NewMetrics(reg prometheus.Registerer, opts ...MetricsOption) *Metrics {
	m := &Metrics{
		flushEvery: DefaultFlushInterval,
		opened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_tcp_connections_opened_total", Help: "The total number of TCP connections opened.",
		}, tcpLabels),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_tcp_connections_closed_total", Help: "The total number of TCP connections closed.",
		}, tcpLabels),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_tcp_sent_bytes_total", Help: "Bytes sent from the server to the client (response direction) during TCP connections.",
		}, tcpLabels),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_tcp_received_bytes_total", Help: "Bytes received from the client (request direction) during TCP connections.",
		}, tcpLabels),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_tcp_connections_failed_total", Help: "The total number of TCP connections that failed (unstable).",
		}, tcpLabels),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "istio_tcp_sockets_open", Help: "Currently open TCP connections (unstable).",
		}, []string{"reporter"}),
		dryRun:  newDryRunCounter(),
		denials: newDenialCounter(),
	}
	m.openGauge[Outbound] = m.open.WithLabelValues(Outbound.reporter())
	m.openGauge[Inbound] = m.open.WithLabelValues(Inbound.reporter())
	for _, o := range opts {
		o(m)
	}
	if reg != nil {
		reg.MustRegister(m.opened, m.closed, m.sent, m.received, m.failed, m.open, m.dryRun, m.denials)
	}
	return m
}
