package proxy

import (
	"errors"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/proxy/conntrace"
)

// Direction of a connection, as the access log and the reporter label name it.
type Direction uint8

// Directions.
const (
	Outbound Direction = iota // accepted on 15001, reporter=source
	Inbound                   // accepted on 15008 or 15006, reporter=destination
)

func (d Direction) String() string {
	if d == Inbound {
		return "inbound"
	}
	return "outbound"
}

func (d Direction) reporter() string {
	if d == Inbound {
		return "destination"
	}
	return "source"
}

// Peer describes one end of a connection with values that come from the
// control plane only (never from untrusted input), so label sets stay bounded.
// The zero value means "unknown".
type Peer struct {
	Workload          string // Workload.workload_name (or name)
	Namespace         string
	CanonicalService  string
	CanonicalRevision string
	Cluster           string
	Region, Zone      string
	// Identity is the SPIFFE identity: for a source only when proven by mTLS;
	// for a destination from the control plane or the peer certificate.
	Identity identity.Identity
	// fromState: the names are a workload of the node's state (peerOf), so
	// its series may go once the state no longer holds it.
	fromState bool
}

// Service is the destination service a connection was addressed to, if any.
type Service struct {
	Hostname  string
	Namespace string
	Name      string
}

// Reason is the closed set of failure reasons a connection ends with.
type Reason string

// Reasons. The empty reason is success.
const (
	ReasonNone              Reason = ""
	ReasonPolicyDenied      Reason = "policy_denied"
	ReasonConnectFailed     Reason = "connect_failed"
	ReasonTLSFailure        Reason = "tls_failure"
	ReasonH2Failure         Reason = "h2_handshake_failure"
	ReasonNoHealthyUpstream Reason = "no_healthy_upstream"
	ReasonUnknownSource     Reason = "unknown_source"
	ReasonUnknownDest       Reason = "unknown_destination"
	ReasonBadRequest        Reason = "bad_request"
	ReasonSelfCall          Reason = "self_call"
	ReasonIdentity          Reason = "identity_error"
	ReasonRevoked           Reason = "revoked"
	ReasonDrained           Reason = "drained"
	ReasonUpstreamStatus    Reason = "upstream_status"
	ReasonInternal          Reason = "internal"
)

// responseFlag maps a reason to Istio's response_flags label value.
func (r Reason) responseFlag() string {
	switch r {
	case ReasonNone, ReasonDrained:
		return "-"
	case ReasonPolicyDenied:
		return "DENY"
	case ReasonRevoked:
		return "CERT_REVOKED" // Istio's ztunnel: a CRL revoked the peer's certificate
	case ReasonConnectFailed, ReasonNoHealthyUpstream, ReasonUpstreamStatus, ReasonUnknownDest, ReasonSelfCall:
		return "CONNECT"
	case ReasonTLSFailure:
		return "TLS_FAILURE"
	case ReasonH2Failure:
		return "H2_HANDSHAKE_FAILURE"
	case ReasonIdentity:
		return "IDENTITY_ERROR"
	}
	return "CONNECT"
}

// failed reports whether a connection that ended with r failed: any reason
// but success and a drain (istio_tcp_connections_failed_total, an error
// span, an error-level access line).
func (r Reason) failed() bool { return r != ReasonNone && r != ReasonDrained }

// ReasonError is implemented by errors that know their Reason.
type ReasonError interface {
	error
	Reason() Reason
}

// reasonErr attaches a reason to a cause.
type reasonErr struct {
	reason Reason
	err    error
}

func (e *reasonErr) Error() string  { return string(e.reason) + ": " + e.err.Error() }
func (e *reasonErr) Unwrap() error  { return e.err }
func (e *reasonErr) Reason() Reason { return e.reason }

// WithReason wraps err so that Result.Record reports r.
func WithReason(r Reason, err error) error {
	if err == nil {
		return nil
	}
	return &reasonErr{reason: r, err: err}
}

// ReasonOf extracts the reason of err (ReasonInternal when none is attached).
func ReasonOf(err error) Reason {
	if err == nil {
		return ReasonNone
	}
	var re ReasonError
	if errors.As(err, &re) {
		return re.Reason()
	}
	if errors.Is(err, ErrForced) {
		return ReasonDrained
	}
	if errors.Is(err, hbone.ErrRevoked) { // the peer's certificate (CRL)
		return ReasonRevoked
	}
	return ReasonInternal
}

// Result is the one record each connection produces: create it
// when the connection is accepted, fill in what becomes known, and
// `defer res.Record(&err)`. Record increments the metrics and writes one
// access-log line, exactly once.
type Result struct {
	m   *Metrics
	log *zap.Logger

	Direction Direction
	Start     time.Time
	SrcAddr   netip.AddrPort
	DstAddr   netip.AddrPort // L4 next hop (podIP:15008 for HBONE)
	OrigAddr  netip.AddrPort // the destination as accepted, before routing
	HBONEAddr netip.AddrPort // inner authority, when tunnelled
	// HBONEHost, when set, is the authority's hostname (double HBONE names
	// the service): the authority is HBONEHost:HBONEAddr.Port().
	HBONEHost string
	Src       Peer
	Dst       Peer
	Service   Service
	MTLS      bool // connection_security_policy=mutual_tls
	Counters  Counters
	// Span is the connection's span (nil: tracing off); Record ends it.
	Span *conntrace.Span

	recorded bool
	opened   bool
	oc       openCounters
	// fmu guards the counts already added to oc (see liveSet).
	fmu                      sync.Mutex
	flushedSent, flushedRecv int64
}

// NewResult starts the record of one connection and counts it as opened.
func NewResult(m *Metrics, log *zap.Logger, dir Direction, src, dst netip.AddrPort) *Result {
	r := &Result{m: m, log: log, Direction: dir, Start: time.Now(), SrcAddr: src, DstAddr: dst, OrigAddr: dst}
	if m != nil {
		m.openGauge[dir].Inc()
		m.openNow.Add(1)
		m.started.Add(1)
	}
	return r
}

// Opened counts the connection in istio_tcp_connections_opened_total with
// what is known of it now (response_flags "-") and reports its bytes while
// it runs, every flush interval, with the same labels. Call it once the
// connection is established (the upstream is connected), after Src, Dst,
// Service and MTLS are filled in. A connection that fails before is counted
// as opened by Record, with its failure's flag. Not safe for concurrent
// use with Record; calls after the first do nothing.
func (r *Result) Opened() {
	if r.opened || r.recorded || r.m == nil {
		return
	}
	r.opened = true
	lp := r.labels(ReasonNone.responseFlag())
	labels := lp[:]
	r.m.opened.WithLabelValues(labels...).Inc()
	r.oc = openCounters{received: r.m.received.WithLabelValues(labels...), sent: r.m.sent.WithLabelValues(labels...)}
	putLabels(lp)
	r.m.addLive(r)
}

// Record writes the metrics and the access-log line. It is safe to call more
// than once; only the first call counts.
func (r *Result) Record(errp *error) {
	if r.recorded {
		return
	}
	r.recorded = true
	var err error
	if errp != nil {
		err = *errp
	}
	reason := ReasonOf(err)
	if r.m != nil {
		r.recordMetrics(reason)
	}
	if r.Span != nil {
		r.Span.End(r.spanName(), r.spanAttrs(reason), reason.failed(), time.Now())
	}
	if r.log == nil {
		return
	}
	level := zap.InfoLevel
	if reason.failed() {
		level = zap.ErrorLevel
	}
	// Check first: with the access log off (a level above info) a close
	// then builds no fields; building them anyway was 2.2 KiB of garbage a
	// connection, which a wave of closes turned into heap growth
	// (bench/soak).
	ce := r.log.Check(level, "connection complete")
	if ce == nil {
		return
	}
	fp := fieldPool.Get().(*[]zap.Field)
	fields := append((*fp)[:0],
		zap.String("src.addr", r.SrcAddr.String()),
		zap.String("src.workload", r.Src.Workload),
		zap.String("src.namespace", r.Src.Namespace),
		zap.String("dst.addr", r.DstAddr.String()),
		zap.String("dst.service", r.Service.Hostname),
		zap.String("dst.workload", r.Dst.Workload),
		zap.String("dst.namespace", r.Dst.Namespace),
		zap.String("direction", r.Direction.String()),
		zap.Int64("bytes_sent", r.Counters.Sent.Load()),
		zap.Int64("bytes_recv", r.Counters.Received.Load()),
		zap.String("duration", time.Since(r.Start).Round(time.Millisecond).String()),
	)
	if a := r.hboneAuthority(); a != "" {
		fields = append(fields, zap.String("dst.hbone_addr", a))
	}
	if !r.Src.Identity.IsZero() {
		fields = append(fields, zap.String("src.identity", r.Src.Identity.String()))
	}
	if !r.Dst.Identity.IsZero() {
		fields = append(fields, zap.String("dst.identity", r.Dst.Identity.String()))
	}
	if reason != ReasonNone {
		fields = append(fields, zap.String("reason", string(reason)), zap.Error(err))
	}
	ce.Write(fields...)
	// zap's cores encode the fields during Write and keep none of them
	// (the observer core of the tests copies them), so the slice is
	// reused; the error is dropped so the pool does not keep it alive.
	clear(fields)
	*fp = fields[:0]
	fieldPool.Put(fp)
}

// fieldPool holds access-line field slices with room for every field
// Record writes.
var fieldPool = sync.Pool{New: func() any { s := make([]zap.Field, 0, 16); return &s }}

// recordMetrics counts the connection as closed (and failed) with
// reason's flag.
func (r *Result) recordMetrics(reason Reason) {
	r.m.openGauge[r.Direction].Dec()
	r.m.openNow.Add(-1)
	lp := r.labels(reason.responseFlag())
	defer putLabels(lp)
	labels := lp[:]
	if r.opened {
		r.m.removeLive(r)
		r.flush(true)
	} else {
		r.m.noteNamed(r)
		r.m.opened.WithLabelValues(labels...).Inc()
		r.m.received.WithLabelValues(labels...).Add(float64(r.Counters.Sent.Load()))
		r.m.sent.WithLabelValues(labels...).Add(float64(r.Counters.Received.Load()))
	}
	r.m.closed.WithLabelValues(labels...).Inc()
	if reason.failed() {
		r.m.failed.WithLabelValues(labels...).Inc()
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func principal(id identity.Identity) string {
	if id.IsZero() {
		return "unknown"
	}
	return id.String()
}

// labelValues are one connection's tcpLabels values. The vectors copy
// the values of a series they create, so the array is pooled: two slices
// of 27 strings a connection were a fifth of its metrics' garbage.
type labelValues [27]string

var labelPool = sync.Pool{New: func() any { return new(labelValues) }}

func putLabels(lp *labelValues) {
	*lp = labelValues{}
	labelPool.Put(lp)
}

// labels fills a pooled array with the connection's label values; give it
// back with putLabels.
func (r *Result) labels(flag string) *labelValues {
	sec := "unknown"
	if r.MTLS {
		sec = "mutual_tls"
	}
	s, d := &r.Src, &r.Dst
	lp := labelPool.Get().(*labelValues)
	*lp = labelValues{
		r.Direction.reporter(),
		orUnknown(s.Workload), orUnknown(s.CanonicalService), orUnknown(s.CanonicalRevision), orUnknown(s.Namespace),
		principal(s.Identity), orUnknown(s.CanonicalService), orUnknown(s.CanonicalRevision), orUnknown(s.Cluster),
		orUnknown(r.Service.Hostname), orUnknown(r.Service.Namespace), orUnknown(r.Service.Name),
		orUnknown(d.Workload), orUnknown(d.CanonicalService), orUnknown(d.CanonicalRevision),
		orUnknown(d.Namespace), principal(d.Identity), orUnknown(d.CanonicalService), orUnknown(d.CanonicalRevision),
		orUnknown(d.Cluster),
		"tcp", flag, sec,
		orUnknown(s.Region), orUnknown(s.Zone), orUnknown(d.Region), orUnknown(d.Zone),
	}
	return lp
}

// spanName is "<direction> <destination>:<port>", the destination the
// service's hostname, else the workload's name, else the address: bounded
// by the mesh, like the metrics' labels.
func (r *Result) spanName() string {
	addr := r.OrigAddr
	if r.Direction == Inbound && r.HBONEAddr.IsValid() {
		addr = r.HBONEAddr
	}
	dst := r.Service.Hostname
	if dst == "" {
		dst = r.Dst.Workload
	}
	if dst == "" {
		dst = addr.Addr().String()
	}
	return r.Direction.String() + " " + dst + ":" + strconv.Itoa(int(addr.Port()))
}

// spanAttrs are the connection's span attributes: the metrics' peers and
// flags under Istio's attribute names, and the byte counts.
func (r *Result) spanAttrs(reason Reason) []attribute.KeyValue {
	sec := "unknown"
	if r.MTLS {
		sec = "mutual_tls"
	}
	s, d := &r.Src, &r.Dst
	attrs := []attribute.KeyValue{
		attribute.String("peer.address", r.SrcAddr.String()),
		attribute.String("upstream_address", r.DstAddr.String()),
		attribute.String("source.workload", orUnknown(s.Workload)),
		attribute.String("source.namespace", orUnknown(s.Namespace)),
		attribute.String("source.principal", principal(s.Identity)),
		attribute.String("destination.workload", orUnknown(d.Workload)),
		attribute.String("destination.namespace", orUnknown(d.Namespace)),
		attribute.String("destination.principal", principal(d.Identity)),
		attribute.String("destination.service", orUnknown(r.Service.Hostname)),
		attribute.String("connection_security_policy", sec),
		attribute.String("response_flags", reason.responseFlag()),
		attribute.Int64("bytes_sent", r.Counters.Sent.Load()),
		attribute.Int64("bytes_received", r.Counters.Received.Load()),
	}
	if a := r.hboneAuthority(); a != "" {
		attrs = append(attrs, attribute.String("hbone.authority", a))
	}
	return attrs
}

// hboneAuthority is the tunnel's authority as sent: ip:port, or
// hostname:port; "" when not tunnelled.
func (r *Result) hboneAuthority() string {
	if r.HBONEHost != "" {
		return r.HBONEHost + ":" + strconv.Itoa(int(r.HBONEAddr.Port()))
	}
	if r.HBONEAddr.IsValid() {
		return r.HBONEAddr.String()
	}
	return ""
}

// LogEarlyDeny writes the one line for a connection rejected before its
// workloads were known.
func LogEarlyDeny(log *zap.Logger, dir Direction, src, dst netip.AddrPort, err error) {
	if log == nil {
		return
	}
	log.Warn("connection failed",
		zap.String("src.addr", src.String()), zap.String("dst.addr", dst.String()),
		zap.String("direction", dir.String()), zap.String("reason", string(ReasonOf(err))), zap.Error(err))
}
