package daemon

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

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

// TestHeapProfileOff: the sampling goes off unless GODEBUG sets
// memprofilerate, and a heap profile asked for while it is off is refused
// with the way to turn it on (its text form still carries MemStats).
func TestHeapProfileOff(t *testing.T) {
	defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
	for _, tc := range []struct {
		godebug string
		off     bool
	}{
		{"", true},
		{"gctrace=1", true},
		{"memprofilerate=4096", false},
		{"gctrace=1, memprofilerate=0", false},
		{"xmemprofilerate=1", true},
	} {
		runtime.MemProfileRate = 512 << 10
		HeapProfileOff(tc.godebug)
		if off := runtime.MemProfileRate == 0; off != tc.off {
			t.Errorf("GODEBUG %q: sampling off = %v, want %v", tc.godebug, off, tc.off)
		}
	}
	runtime.MemProfileRate = 0
	mux := http.NewServeMux()
	DebugHandlers(mux, zap.NewAtomicLevel())
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/heap", nil))
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "GODEBUG=memprofilerate=") {
		t.Errorf("heap profile while off = %d %q, want 409 naming GODEBUG=memprofilerate", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/heap?debug=1", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "# HeapAlloc = ") || rec.Header().Get("X-Heap-Profile") == "" {
		t.Errorf("heap?debug=1 while off = %d, X-Heap-Profile %q, body %.100q", rec.Code, rec.Header().Get("X-Heap-Profile"), rec.Body.String())
	}
}

// TestPprofTrace: trace?seconds=1 answers with an execution trace `go tool
// trace` reads (it starts with the format's header), and a second trace
// while one runs is refused, not mixed into it.
func TestPprofTrace(t *testing.T) {
	mux := http.NewServeMux()
	DebugHandlers(mux, zap.NewAtomicLevel())
	second := make(chan *httptest.ResponseRecorder)
	go func() {
		time.Sleep(200 * time.Millisecond)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/trace?seconds=1", nil))
		second <- rec
	}()
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/trace?seconds=1", nil))
	if rec.Code != 200 || !strings.HasPrefix(rec.Body.String(), "go 1.") {
		t.Fatalf("trace = %d %.40q", rec.Code, rec.Body.String())
	}
	if r := <-second; r.Code != http.StatusConflict {
		t.Errorf("a second trace during the first = %d, want 409", r.Code)
	}
}
