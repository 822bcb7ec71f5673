package routing

import (
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
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
