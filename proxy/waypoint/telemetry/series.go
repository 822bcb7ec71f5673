package telemetry

import (
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Label names of Istio's standard metrics as Istio's waypoint (Envoy's
// istio_stats filter, reporter="waypoint") emits them. The request family
// adds response_code and grpc_response_status to the TCP family's labels.
// Index constants below name the positions.
var (
	tcpLabels = []string{
		"reporter",
		"source_workload", "source_canonical_service", "source_canonical_revision", "source_workload_namespace",
		"source_principal", "source_app", "source_version", "source_cluster",
		"destination_workload", "destination_workload_namespace", "destination_principal",
		"destination_app", "destination_version", "destination_service",
		"destination_canonical_service", "destination_canonical_revision",
		"destination_service_name", "destination_service_namespace", "destination_cluster",
		"request_protocol", "response_flags", "connection_security_policy",
	}
	requestLabels = append(append([]string{}, tcpLabels...), "response_code", "grpc_response_status")
)

const (
	nTCP     = 23
	nRequest = nTCP + 2
	iCode    = nTCP // response_code's index in a request label set
)

// tcpKey and httpKey are label sets, usable as map keys: looking one up
// hashes its strings and allocates nothing.
type (
	tcpKey  [nTCP]string
	httpKey struct {
		lv    [nRequest]string
		route string
		// mask: the families the entry updates (family bits, oursBit);
		// 0 means every family.
		mask uint8
	}
	tcpMapKey struct {
		lv   tcpKey
		mask uint8 // TCP family bits; 0: every family
	}
)

// Defaults of Limits.
const (
	DefaultIdle      = 10 * time.Minute
	DefaultMaxSeries = 20000
)

// Limits bound the waypoint's series (docs/telemetry.md#cardinality).
// Every label value is a control-plane name or one of a small closed set,
// so the label sets are already bounded by the mesh; these bound what a
// mesh that churns workloads, or a peer that sends many baggage names,
// leaves behind:
//   - a label set that no request, stream or open TCP stream used for
//     Idle is deleted from every metric it appears in (checked when the
//     metrics are scraped and when a new label set appears, at most every
//     Idle/4);
//   - when a new label set would make more than Max, the least recently
//     used ones without an open stream are deleted first, down to 90 % of
//     Max.
//
// A deleted counter that comes back starts from zero, which Prometheus'
// rate() reads as a counter reset.
type Limits struct {
	Idle time.Duration // <= 0: DefaultIdle
	Max  int           // <= 0: DefaultMaxSeries
}

// httpSeries are the series one HTTP request updates, looked up once per
// label set and kept until evicted: WithLabelValues hashes and compares
// every label on each call, and six calls per request were ~4 % of the
// waypoint's CPU at 1k req/s (bench/waypoint).
type httpSeries struct {
	requests, routeRequests                      prometheus.Counter
	duration, reqBytes, respBytes, routeDuration prometheus.Observer
	used                                         atomic.Int64 // unix nanoseconds
}

// tcpSeries are one TCP label set's counters; open counts the streams
// that report under it and keeps it from eviction.
type tcpSeries struct {
	opened, closed, sent, received prometheus.Counter
	used                           atomic.Int64
	open                           atomic.Int32
}

// seriesCache holds the label sets in use. Lookups take the read lock;
// a new label set and the sweep take the write lock.
type seriesCache struct {
	limits Limits
	now    func() time.Time
	m      *metrics

	mu        sync.RWMutex
	http      map[httpKey]*httpSeries
	tcp       map[tcpMapKey]*tcpSeries
	lastSweep time.Time
}

func (c *seriesCache) size() int { return len(c.http) + len(c.tcp) }

// httpFor returns the series of k, creating them when new.
func (c *seriesCache) httpFor(k *httpKey) *httpSeries {
	now := c.now()
	c.mu.RLock()
	s := c.http[*k]
	if s != nil {
		s.used.Store(now.UnixNano()) // under the lock: the sweep sees it
	}
	c.mu.RUnlock()
	if s == nil {
		c.mu.Lock()
		if s = c.http[*k]; s == nil {
			c.makeRoomLocked(now)
			m, lv, mask := c.m, k.lv[:], k.mask
			if mask == 0 {
				mask = allHTTP
			}
			s = &httpSeries{}
			if mask&(1<<famRequests) != 0 {
				s.requests = m.requests.WithLabelValues(lv...)
			}
			if mask&(1<<famDuration) != 0 {
				s.duration = m.duration.WithLabelValues(lv...)
			}
			if mask&(1<<famReqBytes) != 0 {
				s.reqBytes = m.reqBytes.WithLabelValues(lv...)
			}
			if mask&(1<<famRespBytes) != 0 {
				s.respBytes = m.respBytes.WithLabelValues(lv...)
			}
			if mask&oursBit != 0 {
				s.routeRequests = m.routeRequests.WithLabelValues(k.route, k.lv[iCode])
				s.routeDuration = m.routeDuration.WithLabelValues(k.route)
			}
			c.http[*k] = s
		}
		s.used.Store(now.UnixNano())
		c.mu.Unlock()
	}
	return s
}

// tcpFor returns the series of k, creating them when new, with one more
// open stream.
func (c *seriesCache) tcpFor(lv *tcpKey, mask uint8) *tcpSeries {
	now := c.now()
	k := &tcpMapKey{lv: *lv, mask: mask}
	c.mu.RLock()
	s := c.tcp[*k]
	if s != nil {
		s.open.Add(1) // under the lock: the sweep sees it
		s.used.Store(now.UnixNano())
	}
	c.mu.RUnlock()
	if s == nil {
		c.mu.Lock()
		if s = c.tcp[*k]; s == nil {
			c.makeRoomLocked(now)
			m, lv := c.m, k.lv[:]
			if mask == 0 {
				mask = allTCP
			}
			s = &tcpSeries{}
			if mask&(1<<(famTCPOpened-famTCPOpened)) != 0 {
				s.opened = m.tcpOpened.WithLabelValues(lv...)
			}
			if mask&(1<<(famTCPClosed-famTCPOpened)) != 0 {
				s.closed = m.tcpClosed.WithLabelValues(lv...)
			}
			if mask&(1<<(famTCPSent-famTCPOpened)) != 0 {
				s.sent = m.tcpSent.WithLabelValues(lv...)
			}
			if mask&(1<<(famTCPReceived-famTCPOpened)) != 0 {
				s.received = m.tcpReceived.WithLabelValues(lv...)
			}
			c.tcp[*k] = s
		}
		s.open.Add(1)
		s.used.Store(now.UnixNano())
		c.mu.Unlock()
	}
	return s
}

// release ends one stream of s.
func (c *seriesCache) release(s *tcpSeries) {
	s.used.Store(c.now().UnixNano())
	s.open.Add(-1)
}

// sweep deletes the idle label sets if the last sweep is Idle/4 old.
func (c *seriesCache) sweep() {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Sub(c.lastSweep) >= c.limits.Idle/4 {
		c.sweepLocked(now, c.limits.Max)
	}
}

// makeRoomLocked runs before a label set is added: the idle sweep when it
// is due, and the eviction of the least recently used when at Max.
func (c *seriesCache) makeRoomLocked(now time.Time) {
	if now.Sub(c.lastSweep) >= c.limits.Idle/4 || c.size() >= c.limits.Max {
		c.sweepLocked(now, c.limits.Max*9/10)
	}
}

// sweepLocked deletes every label set idle for Idle, then, while more than
// keep remain, the least recently used without an open stream.
func (c *seriesCache) sweepLocked(now time.Time, keep int) {
	c.lastSweep = now
	cutoff := now.Add(-c.limits.Idle).UnixNano()
	type cand struct {
		used int64
		h    *httpKey
		t    *tcpMapKey
	}
	var lru []cand
	over := c.size() > keep
	for k, s := range c.http {
		if u := s.used.Load(); u <= cutoff {
			c.deleteHTTP(k)
		} else if over {
			lru = append(lru, cand{used: u, h: &k})
		}
	}
	for k, s := range c.tcp {
		if s.open.Load() > 0 {
			continue
		}
		if u := s.used.Load(); u <= cutoff {
			c.deleteTCP(k)
		} else if over {
			lru = append(lru, cand{used: u, t: &k})
		}
	}
	if n := c.size() - keep; n > 0 {
		sort.Slice(lru, func(i, j int) bool { return lru[i].used < lru[j].used })
		for _, e := range lru[:min(n, len(lru))] {
			if e.h != nil {
				c.deleteHTTP(*e.h)
			} else {
				c.deleteTCP(*e.t)
			}
		}
	}
}

func (c *seriesCache) deleteHTTP(k httpKey) {
	s := c.http[k]
	delete(c.http, k)
	m, lv := c.m, k.lv[:]
	if s.requests != nil {
		m.requests.DeleteLabelValues(lv...)
	}
	if s.duration != nil {
		m.duration.DeleteLabelValues(lv...)
	}
	if s.reqBytes != nil {
		m.reqBytes.DeleteLabelValues(lv...)
	}
	if s.respBytes != nil {
		m.respBytes.DeleteLabelValues(lv...)
	}
	// The route series are ours and few (routes × codes): kept.
}

func (c *seriesCache) deleteTCP(k tcpMapKey) {
	s := c.tcp[k]
	delete(c.tcp, k)
	m, lv := c.m, k.lv[:]
	if s.opened != nil {
		m.tcpOpened.DeleteLabelValues(lv...)
	}
	if s.closed != nil {
		m.tcpClosed.DeleteLabelValues(lv...)
	}
	if s.sent != nil {
		m.tcpSent.DeleteLabelValues(lv...)
	}
	if s.received != nil {
		m.tcpReceived.DeleteLabelValues(lv...)
	}
}

// flush forgets every label set (the series stay; the next request finds
// its series again): Activate calls it after deleting the series of the
// families whose overrides changed, so no entry keeps a deleted one.
func (c *seriesCache) flush() {
	c.mu.Lock()
	c.http = map[httpKey]*httpSeries{}
	c.tcp = map[tcpMapKey]*tcpSeries{}
	c.mu.Unlock()
}

// sweeper runs the idle sweep when the registry is gathered (a scrape):
// no goroutine of its own, and stale series leave before they are read.
type sweeper struct{ c *seriesCache }

func (sweeper) Describe(chan<- *prometheus.Desc)   {} // unchecked: it exports nothing
func (s sweeper) Collect(chan<- prometheus.Metric) { s.c.sweep() }

// codes are the response_code values of the statuses a proxy answers,
// rendered once: strconv.Itoa allocates for numbers of three digits.
var codes = func() (t [600]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

func codeLabel(code int) string {
	if code >= 0 && code < len(codes) {
		return codes[code]
	}
	return strconv.Itoa(code)
}
