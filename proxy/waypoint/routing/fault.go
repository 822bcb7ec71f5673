package routing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// Fault injection (VirtualService http fault), as Envoy's fault filter
// runs it: after the route is chosen and before the request goes upstream
// (so before mirroring, and outside the route timeout, which starts
// upstream). A delay holds the request (ended early if the client goes
// away); an abort answers its status with Envoy's body "fault filter
// abort" and the access-log flag FI. Each applies to its percentage of
// requests, drawn independently.

// faultAbortBody is what Envoy's fault filter answers on abort.
const faultAbortBody = "fault filter abort"

// compiledFault is a rule's fault with its percentages in parts per
// million, so one draw of Rand(1e6) decides.
type compiledFault struct {
	delay       time.Duration
	delayPPM    uint64
	abortStatus int
	abortPPM    uint64
}

func compileFault(f *waypointapi.Fault) *compiledFault {
	if f == nil {
		return nil
	}
	ppm := func(pct float64) uint64 { return uint64(min(max(pct, 0), 100) * 10_000) }
	cf := &compiledFault{delay: time.Duration(f.GetDelayMs()) * time.Millisecond, delayPPM: ppm(f.GetDelayPercent()),
		abortStatus: int(f.GetAbortStatus()), abortPPM: ppm(f.GetAbortPercent())}
	if cf.delay <= 0 {
		cf.delayPPM = 0
	}
	if cf.abortStatus == 0 {
		cf.abortPPM = 0
	}
	return cf
}

// hit draws one request into a share of ppm parts per million.
func hit(ppm uint64, rnd func(uint64) uint64) bool {
	switch {
	case ppm == 0:
		return false
	case ppm >= 1_000_000:
		return true
	}
	return rnd(1_000_000) < ppm
}

// apply runs the fault for one request: it waits out a picked delay and
// returns the status of a picked abort (0: none). It returns ctx's error
// when the client went away during the delay.
func (f *compiledFault) apply(ctx context.Context, rnd func(uint64) uint64) (int, error) {
	if hit(f.delayPPM, rnd) {
		t := time.NewTimer(f.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		}
	}
	if hit(f.abortPPM, rnd) {
		return f.abortStatus, nil
	}
	return 0, nil
}

// InjectFault runs the fault of the request's rule (nil: none). done: the
// request was answered here (an abort, or the client left during a delay)
// with code and access-log flags, why says so for the access log.
func (rt *Router) InjectFault(rule *Rule, rw http.ResponseWriter, r *http.Request) (code int, flags string, done bool, why error) {
	if rule == nil || rule.fault == nil {
		return 0, "", false, nil
	}
	code, err := rule.fault.apply(r.Context(), rt.rand)
	switch {
	case err != nil:
		return 0, "DC", true, fmt.Errorf("client left during the fault delay: %w", err)
	case code != 0:
		http.Error(rw, faultAbortBody, code)
		return code, "FI", true, errors.New("fault injection abort")
	}
	return 0, "", false, nil
}
