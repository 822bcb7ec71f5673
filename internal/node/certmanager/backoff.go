package certmanager

import "time"

// Retry backoff defaults, as Istio's ztunnel uses for certificate fetches.
const (
	DefaultInitialBackoff = 500 * time.Millisecond
	DefaultMaxBackoff     = 150 * time.Second
	backoffJitter         = 0.2
)

// backoffDelay is the wait before retry number failures (1 after the first
// failure): initial·2^(failures-1), scaled by 1±20 % with r in [0,1) choosing
// the point in that range, and never more than max.
func backoffDelay(failures int, initial, max time.Duration, r float64) time.Duration {
	if failures < 1 {
		failures = 1
	}
	d := initial
	for i := 1; i < failures && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	d = time.Duration(float64(d) * (1 - backoffJitter + 2*backoffJitter*r))
	if d > max {
		d = max
	}
	return d
}
