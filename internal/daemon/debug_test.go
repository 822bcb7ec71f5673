package daemon

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestPprofHeapGC: heap?gc=1 collects before writing the profile, as
// net/http/pprof does; bench/soak reads the live heap from its HeapAlloc
// line and, without the collection, measured whatever garbage the last
// cycle had left (a quiet proxy may not collect for two minutes).
func TestPprofHeapGC(t *testing.T) {
	mux := http.NewServeMux()
	DebugHandlers(mux, zap.NewAtomicLevel())
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/heap?gc=1&debug=1", nil))
	runtime.ReadMemStats(&after)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "# HeapAlloc = ") {
		t.Fatalf("heap?gc=1&debug=1 = %d %.200q", rec.Code, rec.Body.String())
	}
	if after.NumGC <= before.NumGC {
		t.Errorf("heap?gc=1 ran no garbage collection (NumGC %d → %d)", before.NumGC, after.NumGC)
	}
}
