package routing

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// Outlier detection (DestinationRule outlierDetection, Istio's circuit
// breaker), as Envoy does it for consecutive errors:
//
//   - a 5xx answer counts towards consecutive5xxErrors, a 502/503/504
//     towards consecutiveGatewayErrors as well; a local failure (connect
//     failure, reset, per-try timeout) counts as both (Envoy without
//     split_external_local_origin_errors); any other answer resets both;
//   - reaching a threshold ejects the endpoint at once for base_ejection_time
//     × the number of times it has been ejected (capped at 300 s, Envoy's
//     max_ejection_time), unless that would eject more than
//     max_ejection_percent of the pool's endpoints (the endpoint being
//     ejected included, as Envoy counts);
//   - the multiplier drops by one for every interval the endpoint stays
//     un-ejected (computed when it is next ejected, where Envoy ticks).
//
// An ejected endpoint is skipped by pickEndpoint until its time is up (it
// is checked on each pick, not at interval ticks as Envoy does: an ejection
// may end up to one interval earlier). With every endpoint ejected the
// request answers 503, as Istio's default (minHealthPercent 0) does.
type outlierPolicy struct {
	consec5xx, consecGw uint32
	interval, base      time.Duration
	maxPercent          int64
}

// maxEjectionTime is Envoy's default max_ejection_time.
const maxEjectionTime = 300 * time.Second

func compileOutlier(o *waypointapi.OutlierDetection) *outlierPolicy {
	if o == nil {
		return nil
	}
	return &outlierPolicy{
		consec5xx: o.GetConsecutiveServerErrors(), consecGw: o.GetConsecutiveGatewayErrors(),
		interval: time.Duration(o.GetIntervalMs()) * time.Millisecond, base: time.Duration(o.GetBaseEjectionTimeMs()) * time.Millisecond,
		maxPercent: int64(min(o.GetMaxEjectionPercent(), 100)),
	}
}

// outcome classifies one attempt's result for outlier detection.
type outcome int

const (
	outcomeSuccess outcome = iota
	outcome5xx             // a 5xx other than a gateway error
	outcomeGateway         // 502, 503, 504, or a local failure
	outcomeNone            // not the endpoint's doing (the client went away)
)

func classify(ctx context.Context, resp *http.Response, err error) outcome {
	switch {
	case err != nil && (errors.Is(err, context.Canceled) && ctx.Err() != nil):
		return outcomeNone
	case err != nil:
		return outcomeGateway
	case resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusGatewayTimeout:
		return outcomeGateway
	case resp.StatusCode >= 500:
		return outcome5xx
	}
	return outcomeSuccess
}

// record counts one outcome for endpoint st of pool p at time now (unix ns)
// and returns the ejection time when it ejected the endpoint (0: not).
func (o *outlierPolicy) record(p *pool, st *endpointStats, oc outcome, now int64) time.Duration {
	switch oc {
	case outcomeNone:
		return 0
	case outcomeSuccess:
		st.consec5xx.Store(0)
		st.consecGw.Store(0)
		return 0
	}
	n5 := st.consec5xx.Add(1)
	ng := uint32(0)
	if oc == outcomeGateway {
		ng = st.consecGw.Add(1)
	} else {
		st.consecGw.Store(0)
	}
	// Only the request that reaches a threshold (the CAS winner) ejects.
	switch {
	case o.consecGw > 0 && ng >= o.consecGw && st.consecGw.CompareAndSwap(ng, 0):
		st.consec5xx.Store(0)
	case o.consec5xx > 0 && n5 >= o.consec5xx && st.consec5xx.CompareAndSwap(n5, 0):
		st.consecGw.Store(0)
	default:
		return 0
	}
	if st.ejectedUntil.Load() > now {
		return 0 // already ejected (a request that was in flight)
	}
	total := p.size.Load()
	var ejected int64
	p.eps.Range(func(_, v any) bool {
		if v.(*endpointStats).ejectedUntil.Load() > now {
			ejected++
		}
		return true
	})
	if total <= 0 || (ejected+1)*100 > o.maxPercent*total {
		return 0 // max_ejection_percent
	}
	m := st.ejections.Load()
	if prev := st.ejectedUntil.Load(); prev > 0 && o.interval > 0 {
		healthy := uint32(min((now-prev)/int64(o.interval), 1<<31))
		m -= min(m, healthy)
	}
	m++
	st.ejections.Store(m)
	d := min(o.base*time.Duration(m), max(o.base, maxEjectionTime))
	st.ejectedUntil.Store(now + int64(d))
	return d
}

// Done ends the attempt pk made for a request of route: its outcome (resp
// or err) feeds outlier detection, and it no longer counts as active. With
// neither (the attempt never went upstream) it only stops counting. With a
// response, the attempt keeps its place under the circuit breakers until
// its body is through: the caller then calls pk.Release.
func (rt *Router) Done(ctx context.Context, pk *Picked, route string, resp *http.Response, err error) {
	pk.st.active.Add(-1)
	if resp == nil {
		pk.release()
	}
	if pk.outlier == nil || resp == nil && err == nil {
		return
	}
	if d := pk.outlier.record(pk.pool, pk.st, classify(ctx, resp, err), rt.now()); d > 0 {
		rt.log.Info("outlier detection ejected an endpoint", zap.String("workload", pk.uid),
			zap.String("route", route), zap.Duration("for", d))
	}
}
