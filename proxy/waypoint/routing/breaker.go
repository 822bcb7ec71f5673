package routing

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// Circuit breaking (DestinationRule connectionPool), as Istio configures
// Envoy's per-cluster thresholds; the cluster is a pool (host, subset,
// port), so two routes to one backend share its limits:
//
//   - http2MaxRequests (max_requests): attempts in flight at once, on
//     HTTP/1.1 and HTTP/2 alike; one more is refused;
//   - tcp.maxConnections (max_connections): HTTP/1.1 upstream connections
//     in use at once (one request each); a request that finds them all in
//     use waits (pending) for one, and http1MaxPendingRequests
//     (max_pending_requests) bounds how many wait; one more is refused.
//     A request waits at most the connect timeout (Istio's default 10 s);
//     HTTP/2 upstream streams share a connection and do not wait;
//   - maxRetries (max_retries): retries in flight at once; a retry over it
//     is not sent and the last answer stands, as Envoy does;
//   - maxRequestsPerConnection, idleTimeout, connectTimeout: per upstream
//     connection, applied by the root package (Picked's accessors).
//
// A refused request answers 503 with Envoy's overflow body and the
// response flag UO. Limits of 0 are no limit (Istio's default 2^32-1).
type limits struct {
	maxConns, maxPending, maxRequests, maxRetries int64
	perConn                                       int
	connectTimeout, idleTimeout                   time.Duration
}

func compileLimits(cp *waypointapi.ConnectionPool) *limits {
	if cp == nil {
		return nil
	}
	return &limits{maxConns: int64(cp.GetMaxConnections()), maxPending: int64(cp.GetMaxPendingRequests()),
		maxRequests: int64(cp.GetMaxRequests()), maxRetries: int64(cp.GetMaxRetries()),
		perConn:        int(cp.GetMaxRequestsPerConnection()),
		connectTimeout: time.Duration(cp.GetConnectTimeoutMs()) * time.Millisecond,
		idleTimeout:    time.Duration(cp.GetIdleTimeoutMs()) * time.Millisecond}
}

// defaultConnectTimeout is Istio's connectTimeout default: how long a
// pending request waits for a connection.
const defaultConnectTimeout = 10 * time.Second

// OverflowBody is Envoy's answer to a request a circuit breaker refused.
const OverflowBody = "upstream connect error or disconnect/reset before headers. reset reason: overflow"

// breaker is one pool's circuit breaker counters.
type breaker struct {
	requests, pending, retries atomic.Int64
	mu                         sync.Mutex
	slots                      chan struct{} // one token per connection in use; cap: maxConnections
}

func overflow(what, host string) error {
	return &stream.Refusal{Code: http.StatusServiceUnavailable, Msg: what + " of " + host + " overflowed (DestinationRule connectionPool)",
		Body: OverflowBody, Flag: "UO"}
}

// admitRequest counts one attempt against max_requests.
func (cb *breaker) admitRequest(l *limits, host string) error {
	if l.maxRequests == 0 {
		return nil
	}
	if cb.requests.Add(1) > l.maxRequests {
		cb.requests.Add(-1)
		return overflow("http2MaxRequests", host)
	}
	return nil
}

// slotsOf returns the connection tokens for a limit of n (a new set when
// the limit changed; holders release to the set they took from).
func (cb *breaker) slotsOf(n int64) chan struct{} {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.slots == nil || int64(cap(cb.slots)) != n {
		cb.slots = make(chan struct{}, n)
	}
	return cb.slots
}

// Acquire takes an upstream connection for pk's attempt under its pool's
// tcp.maxConnections, waiting as a pending request when all are in use
// (multiplexed: an HTTP/2 stream, which takes none). The error is a
// *stream.Refusal (overflow) or ctx's. Done gives the connection back.
func (rt *Router) Acquire(ctx context.Context, pk *Picked, host string, multiplexed bool) error {
	if pk == nil || pk.limits == nil || pk.limits.maxConns == 0 || multiplexed || pk.slots != nil {
		return nil
	}
	l, cb := pk.limits, &pk.pool.cb
	slots := cb.slotsOf(l.maxConns)
	select {
	case slots <- struct{}{}:
		pk.slots = slots
		return nil
	default:
	}
	if n := cb.pending.Add(1); l.maxPending > 0 && n > l.maxPending {
		cb.pending.Add(-1)
		return overflow("http1MaxPendingRequests", host)
	}
	defer cb.pending.Add(-1)
	wait := l.connectTimeout
	if wait == 0 {
		wait = defaultConnectTimeout
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case slots <- struct{}{}:
		pk.slots = slots
		return nil
	case <-t.C:
		return overflow("tcp.maxConnections (no connection within the connect timeout)", host)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RetryAdmit reports whether a retry after attempt prev may be sent under
// its pool's maxRetries; release (nil when nothing is held) ends it.
func (rt *Router) RetryAdmit(prev *Picked) (ok bool, release func()) {
	if prev == nil || prev.limits == nil || prev.limits.maxRetries == 0 {
		return true, nil
	}
	cb := &prev.pool.cb
	if cb.retries.Add(1) > prev.limits.maxRetries {
		cb.retries.Add(-1)
		return false, nil
	}
	return true, func() { cb.retries.Add(-1) }
}

// Release ends an attempt's place under its pool's circuit breakers once
// its response is through (see Router.Done); nil, or again, does nothing.
func (pk *Picked) Release() {
	if pk != nil {
		pk.release()
	}
}

// release gives back what pk held of its pool's breakers.
func (pk *Picked) release() {
	if pk.request {
		pk.pool.cb.requests.Add(-1)
		pk.request = false
	}
	if pk.slots != nil {
		<-pk.slots
		pk.slots = nil
	}
}

// ConnectTimeout, MaxRequestsPerConnection and IdleTimeout are the
// connectionPool settings of the upstream connection pk's attempt uses (0:
// the waypoint's defaults, no limit). A nil pk has none.
func (pk *Picked) ConnectTimeout() time.Duration {
	if pk == nil || pk.limits == nil {
		return 0
	}
	return pk.limits.connectTimeout
}

func (pk *Picked) MaxRequestsPerConnection() int {
	if pk == nil || pk.limits == nil {
		return 0
	}
	return pk.limits.perConn
}

func (pk *Picked) IdleTimeout() time.Duration {
	if pk == nil || pk.limits == nil {
		return 0
	}
	return pk.limits.idleTimeout
}
