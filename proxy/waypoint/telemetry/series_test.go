package telemetry

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// fakeClock is the seriesCache's clock in tests.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestRecorder(t *testing.T, lim Limits) (*Recorder, *prometheus.Registry, *fakeClock) {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec, err := New(reg, zap.NewNop(), lim)
	if err != nil {
		t.Fatal(err)
	}
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	rec.series.now = clk.now
	return rec, reg, clk
}

// entry is a request from client (demo) to server-v1 through the bound
// service server.demo; tests change what they look at.
func entry(t *testing.T, http bool) *Entry {
	t.Helper()
	peer, err := identity.New("cluster.local", "demo", "sa-client")
	if err != nil {
		t.Fatal(err)
	}
	return &Entry{
		Peer: peer,
		Source: Peer{Workload: "client", Namespace: "demo", Principal: "spiffe://cluster.local/ns/demo/sa/sa-client",
			CanonicalService: "client", CanonicalRevision: "v1", Cluster: "Kubernetes"},
		Destination: Peer{Workload: "server-v1", Namespace: "demo", Principal: "spiffe://cluster.local/ns/demo/sa/server",
			CanonicalService: "server", CanonicalRevision: "v1", Cluster: "Kubernetes"},
		ServiceName: "server", ServiceNamespace: "demo",
		Attrs:   &stream.Attrs{HTTP: http, Service: "server.demo.svc.cluster.local"},
		Verdict: &stream.Verdict{Allow: true},
		Code:    200,
	}
}

// TestHTTPSeriesCache: one label set and route is looked up once and
// kept; another response code or route is its own set of series, and the
// cached ones count into the registered vectors.
func TestHTTPSeriesCache(t *testing.T) {
	rec, _, _ := newTestRecorder(t, Limits{})
	key := func(code int, route string) *httpKey {
		var k httpKey
		ex := entry(t, true)
		tcpLabelValues((*tcpKey)(k.lv[:nTCP]), ex, "http", "-")
		k.lv[iCode], k.route = codeLabel(code), route
		return &k
	}
	c := rec.series
	a, b := c.httpFor(key(200, "demo/r")), c.httpFor(key(200, "demo/r"))
	if a != b {
		t.Fatal("the same labels and route gave two series sets")
	}
	if x, y := c.httpFor(key(503, "demo/r")), c.httpFor(key(200, "-")); x == a || y == a || x == y {
		t.Fatal("another code or route shares a cached series set")
	}
	a.requests.Inc()
	b.requests.Inc()
	if got := testutil.ToFloat64(rec.m.requests.WithLabelValues(key(200, "").lv[:]...)); got != 2 {
		t.Errorf("istio_requests_total{code=200} = %v, want 2", got)
	}
	a.routeRequests.Inc()
	if got := testutil.ToFloat64(rec.m.routeRequests.WithLabelValues("demo/r", "200")); got != 1 {
		t.Errorf("route series = %v, want 1", got)
	}
}

// TestCountAllocs: once a label set was seen, counting a request or
// opening and closing a TCP stream under it looks its series up without
// building a label slice or key string: the only allocation is the
// TCP stream's handle.
func TestCountAllocs(t *testing.T) {
	rec, _, _ := newTestRecorder(t, Limits{})
	h, tcp := entry(t, true), entry(t, false)
	rec.count(h, "http", "-")
	rec.count(tcp, "tcp", "-").Done(1, 1)
	if n := testing.AllocsPerRun(200, func() { rec.count(h, "http", "-") }); n != 0 {
		t.Errorf("an HTTP request's metrics allocate %v times, want 0", n)
	}
	if n := testing.AllocsPerRun(200, func() { rec.count(tcp, "tcp", "-").Done(10, 20) }); n > 2 {
		t.Errorf("a TCP stream's metrics allocate %v times, want <= 2 (its handle)", n)
	}
}

// TestSeriesIdleEviction: a label set unused for Limits.Idle leaves every
// istio_* metric at the next scrape; one used since stays, and so does a
// TCP label set while a stream still reports under it, whatever its age.
func TestSeriesIdleEviction(t *testing.T) {
	rec, reg, clk := newTestRecorder(t, Limits{Idle: time.Minute})
	old, fresh, open := entry(t, true), entry(t, true), entry(t, false)
	old.Source.Workload = "gone"
	rec.Record(old)
	st := rec.Record(open)
	clk.advance(50 * time.Second)
	rec.Record(fresh)
	clk.advance(20 * time.Second) // old: 70 s idle; fresh: 20 s
	// The sweep runs in a scrape, concurrently with the other collectors:
	// its deletions show from that scrape or the next.
	count := func(name string) int {
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
		n, err := testutil.GatherAndCount(reg, name)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count("istio_requests_total"); n != 1 {
		t.Errorf("%d istio_requests_total series after the idle sweep, want 1 (the fresh one)", n)
	}
	if n := count("istio_request_duration_milliseconds"); n != 1 {
		t.Errorf("%d duration series, want 1", n)
	}
	if n := count("istio_tcp_connections_opened_total"); n != 1 {
		t.Errorf("%d TCP series while a stream is open, want 1", n)
	}
	st.Done(5, 7)
	if got := testutil.ToFloat64(rec.m.tcpSent); got != 7 {
		t.Errorf("istio_tcp_sent_bytes_total = %v, want 7", got)
	}
	clk.advance(2 * time.Minute)
	if n := count("istio_tcp_connections_closed_total") + count("istio_requests_total"); n != 0 {
		t.Errorf("%d series left after everything was idle for 2 minutes, want 0", n)
	}
}

// TestSeriesMaxEviction: past Limits.Max label sets, the least recently
// used go first, down to 90 % of Max; the registry never holds more.
func TestSeriesMaxEviction(t *testing.T) {
	rec, reg, clk := newTestRecorder(t, Limits{Idle: time.Hour, Max: 10})
	for i := range 25 {
		ex := entry(t, true)
		ex.Source.Workload = "w" + codeLabel(i)
		rec.Record(ex)
		clk.advance(time.Second)
		if n := rec.series.size(); n > 10 {
			t.Fatalf("%d label sets after %d workloads, want <= 10", n, i+1)
		}
	}
	n, err := testutil.GatherAndCount(reg, "istio_requests_total")
	if err != nil || n > 10 {
		t.Fatalf("%d istio_requests_total series (%v), want <= 10", n, err)
	}
	// The newest survives, the oldest did not.
	if _, ok := rec.series.http[lastKey(t, rec, "w24")]; !ok {
		t.Error("the most recent label set was evicted")
	}
	if _, ok := rec.series.http[lastKey(t, rec, "w0")]; ok {
		t.Error("the least recently used label set was kept")
	}
}

func lastKey(t *testing.T, rec *Recorder, workload string) httpKey {
	ex := entry(t, true)
	ex.Source.Workload = workload
	var k httpKey
	tcpLabelValues((*tcpKey)(k.lv[:nTCP]), ex, "http", "-")
	k.lv[iCode], k.route = codeLabel(http.StatusOK), "-"
	return k
}
