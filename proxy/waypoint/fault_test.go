package waypoint

import (
	"net/http"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestFaultShare: a percentage is parts per million of one draw.
func TestFaultShare(t *testing.T) {
	f := compileFault(&waypointapi.Fault{AbortStatus: 500, AbortPercent: 12.5, DelayPercent: 100})
	if f.abortPPM != 125_000 || f.delayPPM != 0 {
		t.Fatalf("compiled %+v (a delay without a duration never applies)", f)
	}
	if !hit(125_000, func(uint64) uint64 { return 124_999 }) || hit(125_000, func(uint64) uint64 { return 125_000 }) ||
		hit(0, func(uint64) uint64 { return 0 }) || !hit(1_000_000, nil) {
		t.Error("hit draws wrong")
	}
}

// TestFaultInjection: Istio's ratings test samples at the waypoint: a
// header-matched abort answers its status with Envoy's body without
// reaching a backend, a fixed delay holds the request that long, and
// requests the fault rule does not match pass untouched.
func TestFaultInjection(t *testing.T) {
	server := &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server"), Namespace: "demo", Weight: 1}
	l := subsetLab(t, &waypointapi.Route{Name: "ratings", Namespace: "demo", Kind: "VirtualService", Rules: []*waypointapi.RouteRule{
		{Matches: []*waypointapi.RouteMatch{{Headers: []*waypointapi.HeaderMatch{{Name: "end-user", Value: "jason"}}}},
			Fault: &waypointapi.Fault{AbortStatus: 418, AbortPercent: 100}, Backends: []*waypointapi.Backend{server}},
		{Matches: []*waypointapi.RouteMatch{{Headers: []*waypointapi.HeaderMatch{{Name: "end-user", Value: "slow"}}}},
			Fault: &waypointapi.Fault{DelayMs: 300, DelayPercent: 100}, Backends: []*waypointapi.Backend{server}},
		{Backends: []*waypointapi.Backend{server}},
	}})
	c := l.client(clientID, clientIP)
	before := l.hits[0].Load() + l.hits[1].Load()
	if code, body := get(t, c, "/ratings/0", "end-user", "jason"); code != http.StatusTeapot || body != faultAbortBody+"\n" {
		t.Fatalf("abort: %d %q", code, body)
	}
	if l.hits[0].Load()+l.hits[1].Load() != before {
		t.Error("an aborted request reached a backend")
	}
	start := time.Now()
	if code, _ := get(t, c, "/ratings/0", "end-user", "slow"); code != 200 || time.Since(start) < 300*time.Millisecond {
		t.Errorf("delay: %d after %v, want 200 after ≥ 300ms", code, time.Since(start))
	}
	start = time.Now()
	if code, _ := get(t, c, "/ratings/0", "end-user", "other"); code != 200 || time.Since(start) > 250*time.Millisecond {
		t.Errorf("no fault: %d after %v", code, time.Since(start))
	}
}
