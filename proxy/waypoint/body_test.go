package waypoint

import (
	"net/http"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TestSmallBodyHeld: a request body of known length up to smallBodyMax is
// held in memory (one upstream write), so a retry on 503 sends it again
// intact; a larger one streams through and is not retried (the body is
// gone after the first attempt).
func TestSmallBodyHeld(t *testing.T) {
	cfg := baseConfig()
	cfg.Services[0].Routes = []*waypointapi.Route{weightedRoute()}
	l := newLab(t, cfg)
	c := l.client(clientID, clientIP)

	l.fail503.Store(2)
	req, _ := http.NewRequest(http.MethodPost, "http://server.demo.svc.cluster.local/retry", strings.NewReader("payload-7"))
	if code, body := do(t, c, req); code != 200 || !strings.HasPrefix(body, "v1 POST /retry") {
		t.Fatalf("POST /retry after two 503s = %d %q, want v1's answer", code, body)
	}
	if got := *l.last[0].Load(); got != "server.demo.svc.cluster.local payload-7" {
		t.Errorf("v1 got %q after the retries, want the whole body", got)
	}

	l.fail503.Store(1)
	big := strings.Repeat("x", smallBodyMax+1)
	req, _ = http.NewRequest(http.MethodPost, "http://server.demo.svc.cluster.local/retry", strings.NewReader(big))
	if code, _ := do(t, c, req); code != http.StatusServiceUnavailable {
		t.Errorf("POST /retry of %d bytes after one 503 = %d, want the 503 (a streamed body is not replayed)", len(big), code)
	}
	l.fail503.Store(0)
	req, _ = http.NewRequest(http.MethodPost, "http://server.demo.svc.cluster.local/retry", strings.NewReader(big))
	if code, _ := do(t, c, req); code != 200 || *l.last[0].Load() != "server.demo.svc.cluster.local "+big {
		t.Errorf("POST /retry of %d bytes = %d, want 200 with the whole body at v1", len(big), code)
	}
}
