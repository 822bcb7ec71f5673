package waypoint

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestOutlierRecord: consecutive 5xx eject at the threshold (a success in
// between resets the count); gateway errors have their own threshold;
// max_ejection_percent counts the endpoint being ejected; each ejection
// lasts base × times ejected, and the multiplier decays by one per healthy
// interval.
func TestOutlierRecord(t *testing.T) {
	o := compileOutlier(&waypointapi.OutlierDetection{ConsecutiveServerErrors: 3, ConsecutiveGatewayErrors: 2,
		IntervalMs: 1000, BaseEjectionTimeMs: 10_000, MaxEjectionPercent: 50})
	p := &pool{}
	p.size.Store(2)
	a, b := p.stats("a"), p.stats("b")
	now := int64(1e12)
	for i, oc := range []outcome{outcome5xx, outcome5xx, outcomeSuccess, outcome5xx, outcome5xx} {
		if d := o.record(p, a, oc, now); d != 0 {
			t.Fatalf("outcome %d ejected after a reset", i)
		}
	}
	if d := o.record(p, a, outcome5xx, now); d != 10*time.Second || a.ejectedUntil.Load() != now+int64(10*time.Second) {
		t.Fatalf("third consecutive 5xx: ejected for %v, want 10s", d)
	}
	// b's two gateway errors would eject a second of two endpoints: 100% > 50%.
	o.record(p, b, outcomeGateway, now)
	if d := o.record(p, b, outcomeGateway, now); d != 0 {
		t.Fatalf("max_ejection_percent 50 ejected both of two endpoints")
	}
	// Back after 10 s; failing again at once doubles the time.
	now += int64(10 * time.Second)
	for range 2 {
		o.record(p, a, outcome5xx, now)
	}
	if d := o.record(p, a, outcome5xx, now); d != 20*time.Second {
		t.Fatalf("second ejection %v, want 20s", d)
	}
	// 5 healthy intervals after it ends, the multiplier (2) has decayed to 0.
	now += int64(25 * time.Second)
	o.record(p, a, outcomeGateway, now)
	if d := o.record(p, a, outcomeGateway, now); d != 10*time.Second {
		t.Fatalf("ejection after a healthy spell %v, want 10s (multiplier decayed)", d)
	}
	if got := classify(context.Background(), nil, errors.New("connect: refused")); got != outcomeGateway {
		t.Errorf("a connect failure classified %v, want a gateway error", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := classify(ctx, nil, context.Canceled); got != outcomeNone {
		t.Errorf("a client that went away classified %v, want none", got)
	}
	if got := classify(ctx, &http.Response{StatusCode: 500}, nil); got != outcome5xx {
		t.Errorf("500 classified %v", got)
	}
}

// TestOutlierEjection: the endpoint that answers 5xx is ejected after
// consecutive5xxErrors and every later request goes to the other one; once
// its ejection time is over it is picked again.
func TestOutlierEjection(t *testing.T) {
	backend := &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: 1,
		TrafficPolicy: &waypointapi.TrafficPolicy{LoadBalancer: waypointapi.LoadBalancer_ROUND_ROBIN,
			OutlierDetection: &waypointapi.OutlierDetection{ConsecutiveServerErrors: 3, IntervalMs: 100, BaseEjectionTimeMs: 1500, MaxEjectionPercent: 50}}}
	l := subsetLab(t, &waypointapi.Route{Name: "server", Namespace: "demo", Kind: "DestinationRule",
		Rules: []*waypointapi.RouteRule{{Backends: []*waypointapi.Backend{backend}}}})
	c := l.client(clientID, clientIP)
	l.fail503.Store(1 << 30) // v1 answers 503 from now on
	codes := map[int]int{}
	for range 40 {
		code, _ := get(t, c, "/")
		codes[code]++
	}
	// Round robin: v1's first three requests fail, then it is ejected.
	if codes[503] != 3 || codes[200] != 37 {
		t.Fatalf("answers %v, want 3×503 (until ejection) and 37×200 from v2", codes)
	}
	l.fail503.Store(0)
	time.Sleep(1600 * time.Millisecond)
	before := l.hits[0].Load()
	for range 10 {
		if code, body := get(t, c, "/"); code != 200 || !strings.HasPrefix(body, "v") {
			t.Fatalf("after the ejection: %d %q", code, body)
		}
	}
	if l.hits[0].Load() == before {
		t.Error("v1 was not picked again after its ejection time")
	}
}
