package certmanager

import (
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// Retry backoff defaults, as Istio's ztunnel uses for certificate fetches.
const (
	DefaultInitialBackoff = 500 * time.Millisecond
	DefaultMaxBackoff     = 150 * time.Second
	backoffJitter         = 0.2
)

// backoffDelay is the wait before retry number failures (1 after the first
// failure): initial·2^(failures-1), scaled by 1±20 % with r in [0,1) choosing
// the point in that range, and never more than max. It is the tree's one
// backoff (backoff.Policy); each identity keeps its own streak, shown in the
// config dump's certificates.
func backoffDelay(failures int, initial, max time.Duration, r float64) time.Duration {
	return backoff.Policy{Initial: initial, Max: max, Jitter: backoffJitter}.Delay(failures, r)
}
