package routing

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
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
