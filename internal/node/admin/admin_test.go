package admin

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod/inpodstate"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/statetest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

func testDeps(t *testing.T) (Deps, *atomic.Int32) {
	t.Helper()
	store := state.NewStore()
	if err := store.ApplyAddresses(statetest.Mesh(statetest.Config{Workloads: 3, Services: 2, Namespaces: 1, Nodes: 1}), nil); err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "test_things_total", Help: "Things."})
	c.Add(7)
	reg.MustRegister(c)
	var shut atomic.Int32
	done := make(chan struct{})
	close(done)
	return Deps{
		Level:    zap.NewAtomicLevelAt(zapcore.InfoLevel),
		Gatherer: reg,
		Dump: &Dumper{
			State: store,
			Certs: func() []certmanager.CertDump {
				return []certmanager.CertDump{{Identity: "spiffe://cluster.local/ns/a/sa/b", State: certmanager.StateAvailable}}
			},
			Config:  map[string]string{"nodeName": "node-0"},
			Version: "test",
			Pods: func() inpodstate.Dump {
				return inpodstate.Dump{SnapshotReceived: true, Pods: map[string]inpodstate.PodState{
					"uid-1": {Info: inpodstate.Workload{UID: "uid-1", Name: "pod-1", Namespace: "ns-0", ServiceAccount: "sa"}, State: inpodstate.StateUp},
				}}
			},
		},
		Readiness: daemon.NewReadiness(daemon.Task{Name: TaskStateManager, Ready: daemon.Closed(done)}),
		Shutdown:  func() { shut.Add(1) },
	}, &shut
}

func do(t *testing.T, h http.Handler, method, target string) (int, string) {
	t.Helper()
	srv := httptest.NewServer(h) // 127.0.0.1:0
	defer srv.Close()
	req, err := http.NewRequest(method, srv.URL+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestConfigDump(t *testing.T) {
	deps, _ := testDeps(t)
	code, body := do(t, AdminHandler(deps), "GET", "/config_dump")
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	var d struct {
		Generation    uint64                                      `json:"generation"`
		Workloads     []struct{ UID, Namespace, Protocol string } `json:"workloads"`
		Services      []json.RawMessage                           `json:"services"`
		Policies      []json.RawMessage                           `json:"policies"`
		Certificates  []certmanager.CertDump
		Config        map[string]string                 `json:"config"`
		Version       string                            `json:"version"`
		WorkloadState map[string]struct{ State string } `json:"workloadState"`
	}
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if d.Generation != 1 || len(d.Workloads) != 3 || len(d.Services) != 2 || d.Policies == nil {
		t.Errorf("state sections: gen=%d workloads=%d services=%d policies=%v", d.Generation, len(d.Workloads), len(d.Services), d.Policies)
	}
	if d.Workloads[0].UID == "" || d.Workloads[0].Namespace != "ns-0" {
		t.Errorf("workload = %+v", d.Workloads[0])
	}
	if len(d.Certificates) != 1 || d.Certificates[0].State != "Available" {
		t.Errorf("certificates = %+v", d.Certificates)
	}
	if d.Config["nodeName"] != "node-0" || d.Version != "test" || d.WorkloadState["uid-1"].State != "Up" {
		t.Errorf("config=%v version=%q workloadState=%v", d.Config, d.Version, d.WorkloadState)
	}
}

func TestConfigDumpEmptyListsNotNull(t *testing.T) {
	d := (&Dumper{State: state.NewStore()}).Build()
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"workloads":[]`, `"services":[]`, `"policies":[]`, `"certificates":[]`, `"workloadState":{}`, `"generation":0`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("dump %s lacks %s", b, k)
		}
	}
}

func TestLogging(t *testing.T) {
	deps, _ := testDeps(t)
	h := AdminHandler(deps)
	for _, tc := range []struct {
		method, target string
		code           int
		body           string
		level          zapcore.Level
	}{
		{"GET", "/logging", 200, "current log level is info\n", zapcore.InfoLevel},
		{"GET", "/logging?level=debug", 405, "takes POST", zapcore.InfoLevel},
		{"POST", "/logging?level=debug", 200, "current log level is debug\n", zapcore.DebugLevel},
		{"POST", "/logging?level=chatty", 400, "unknown level", zapcore.DebugLevel},
		// istioctl ztunnel-config log without --level posts an empty level:
		// like Istio's ztunnel, that only reads the level.
		{"POST", "/logging", 200, "current log level is debug\n", zapcore.DebugLevel},
		{"POST", "/logging?level=", 200, "current log level is debug\n", zapcore.DebugLevel},
		{"POST", "/logging?reset", 200, "current log level is info\n", zapcore.InfoLevel},
		{"PUT", "/logging", 405, "use GET or POST", zapcore.InfoLevel},
	} {
		code, body := do(t, h, tc.method, tc.target)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("%s %s = %d %q, want %d containing %q", tc.method, tc.target, code, body, tc.code, tc.body)
		}
		if got := deps.Level.Level(); got != tc.level {
			t.Errorf("after %s %s level = %v, want %v", tc.method, tc.target, got, tc.level)
		}
	}
}

func TestQuitQuitQuit(t *testing.T) {
	deps, shut := testDeps(t)
	h := AdminHandler(deps)
	if code, _ := do(t, h, "GET", "/quitquitquit"); code != 405 {
		t.Errorf("GET status %d, want 405", code)
	}
	for range 2 {
		if code, body := do(t, h, "POST", "/quitquitquit"); code != 200 || body != "shutdown now\n" {
			t.Errorf("POST = %d %q", code, body)
		}
	}
	testkit.Eventually(t, 10*time.Second, "Shutdown to be called", func() bool { return shut.Load() != 0 })
	deps.Shutdown = nil
	if code, _ := do(t, AdminHandler(deps), "POST", "/quitquitquit"); code != 501 {
		t.Errorf("without Shutdown: %d, want 501", code)
	}
}

func TestPprofAndIndex(t *testing.T) {
	deps, _ := testDeps(t)
	h := AdminHandler(deps)
	for _, tc := range []struct {
		target string
		code   int
		body   string
	}{
		{"/", 200, "/config_dump"},
		{"/debug/pprof/", 200, "goroutine"},
		{"/debug/pprof/goroutine?debug=1", 200, "goroutine profile:"},
		{"/debug/pprof/heap", 200, ""},
		{"/debug/pprof/nonesuch", 404, "unknown profile"},
		{"/nonesuch", 404, ""},
	} {
		code, body := do(t, h, "GET", tc.target)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("GET %s = %d %.80q, want %d containing %q", tc.target, code, body, tc.code, tc.body)
		}
	}
	code, body := do(t, h, "GET", "/debug/pprof/profile?seconds=1")
	if code != 200 || len(body) == 0 {
		t.Errorf("cpu profile = %d, %d bytes", code, len(body))
	}
}

func TestStats(t *testing.T) {
	deps, _ := testDeps(t)
	h := StatsHandler(deps.Gatherer, zap.NewNop())
	for _, p := range []string{"/metrics", "/stats/prometheus"} {
		code, body := do(t, h, "GET", p)
		if code != 200 || !strings.Contains(body, "test_things_total 7") || !strings.Contains(body, "go_goroutines") ||
			!strings.Contains(body, "process_") {
			t.Errorf("GET %s = %d %.200q", p, code, body)
		}
	}
}

func TestReadiness(t *testing.T) {
	xdsSynced, zdsReady := make(chan struct{}), make(chan struct{})
	r := daemon.NewReadiness(daemon.Task{Name: TaskWorkloadProxyManager, Ready: daemon.Closed(zdsReady)},
		daemon.Task{Name: TaskStateManager, Ready: daemon.Closed(xdsSynced)})
	for _, tc := range []struct {
		closeCh chan struct{}
		code    int
		body    string
	}{
		{nil, 503, "not ready, pending: state manager, workload proxy manager"},
		{xdsSynced, 503, "not ready, pending: workload proxy manager"},
		{zdsReady, 200, "ready\n"},
	} {
		if tc.closeCh != nil {
			close(tc.closeCh)
		}
		code, body := do(t, r, "GET", "/healthz/ready")
		if code != tc.code || body != tc.body {
			t.Errorf("= %d %q, want %d %q", code, body, tc.code, tc.body)
		}
	}
	if code, _ := do(t, r, "GET", "/other"); code != 404 {
		t.Errorf("other path = %d", code)
	}
}

func TestListenServeAndShutdown(t *testing.T) {
	deps, _ := testDeps(t)
	s, err := Listen(Config{AdminAddr: "127.0.0.1:0", StatsAddr: "127.0.0.1:0", ReadinessAddr: "127.0.0.1:0"}, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	for name, path := range map[string]string{"admin": "/config_dump", "stats": "/metrics", "readiness": "/healthz/ready"} {
		addrs := s.Addrs(name)
		if len(addrs) != 1 {
			t.Fatalf("%s addrs = %v", name, addrs)
		}
		resp, err := http.Get("http://" + addrs[0].String() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s %s = %d", name, path, resp.StatusCode)
		}
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve = %v", err)
	}
	if _, err := http.Get("http://" + s.Addrs("admin")[0].String() + "/"); err == nil {
		t.Error("admin still answers after shutdown")
	}
}

func TestListenAdminLoopbackOnly(t *testing.T) {
	deps, _ := testDeps(t)
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", ":0", "10.1.2.3:0", "example.com:0"} {
		if s, err := Listen(Config{AdminAddr: addr}, deps); err == nil {
			s.Close()
			t.Errorf("admin on %s accepted", addr)
		}
	}
	s, err := Listen(Config{AdminAddr: "localhost:0"}, deps)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, a := range s.Addrs("admin") {
		if !strings.HasPrefix(a.String(), "127.0.0.1:") && !strings.HasPrefix(a.String(), "[::1]:") {
			t.Errorf("localhost bound %s", a)
		}
	}
}

// TestStatsGzip: /metrics is gzip-compressed when the scraper asks for it
// (Accept-Encoding: gzip, as Prometheus sends), plain otherwise.
func TestStatsGzip(t *testing.T) {
	deps, _ := testDeps(t)
	h := StatsHandler(deps.Gatherer, zap.NewNop())
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 200 || rec.Header().Get("Content-Encoding") != "gzip" {
		t.Fatalf("GET /metrics with Accept-Encoding gzip = %d, Content-Encoding %q", rec.Code, rec.Header().Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(zr)
	if err != nil || !strings.Contains(string(body), "test_things_total 7") {
		t.Errorf("gunzipped body %.200q, %v", body, err)
	}
	if code, body := do(t, h, "GET", "/metrics"); code != 200 || !strings.Contains(body, "test_things_total 7") {
		t.Errorf("plain GET /metrics = %d %.100q", code, body)
	}
}
