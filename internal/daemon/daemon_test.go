package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestLogFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		level   zapcore.Level
		format  string
		wantErr string
	}{
		{nil, zapcore.InfoLevel, FormatJSON, ""},
		{[]string{"--log-level=debug", "--log-format=console"}, zapcore.DebugLevel, FormatConsole, ""},
		{[]string{"--log-level=WARNING", "--log-format=plain"}, zapcore.WarnLevel, FormatConsole, ""},
		{[]string{"--log-level=trace"}, zapcore.DebugLevel, FormatJSON, ""},
		{[]string{"--log-level=loud"}, 0, "", "--log-level"},
		{[]string{"--log-format=xml"}, 0, "", "--log-format"},
	} {
		var f LogFlags
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		f.Register(fs, "", "")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		c, err := f.Config()
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: err = %v, want one naming %s", tc.args, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case c.Level != tc.level || c.Format != tc.format:
			t.Errorf("%v: = %v %s, want %v %s", tc.args, c.Level, c.Format, tc.level, tc.format)
		}
	}
}

func TestNewLoggerJSONUnsampled(t *testing.T) {
	var buf bytes.Buffer
	log, level, err := NewLogger(LogConfig{Level: zapcore.InfoLevel, Output: &buf})
	if err != nil {
		t.Fatal(err)
	}
	for range 500 { // zap's production sampler would keep only the first 100
		log.Named("xds").Info("same line")
	}
	log.Debug("hidden")
	level.SetLevel(zapcore.DebugLevel)
	log.Debug("shown")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 501 {
		t.Fatalf("%d lines, want 501 (none sampled away, debug only after SetLevel)", len(lines))
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if first["logger"] != "xds" || first["msg"] != "same line" || first["time"] == nil || first["level"] != "info" {
		t.Errorf("line = %v", first)
	}
	if _, _, err := NewLogger(LogConfig{Format: "xml"}); err == nil {
		t.Error("format xml accepted")
	}
}

func TestReadiness(t *testing.T) {
	synced := make(chan struct{})
	published := false
	r := NewReadiness(Task{"workload proxy manager", func() bool { return published }}, Task{"state manager", Closed(synced)})
	get := func(method, path string) (int, string) {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Code, rec.Body.String()
	}
	for _, step := range []struct {
		do   func()
		code int
		body string
	}{
		{func() {}, 503, "not ready, pending: state manager, workload proxy manager"},
		{func() { close(synced) }, 503, "not ready, pending: workload proxy manager"},
		{func() { published = true }, 200, "ready\n"},
	} {
		step.do()
		if code, body := get("GET", ReadyPath); code != step.code || body != step.body {
			t.Errorf("= %d %q, want %d %q", code, body, step.code, step.body)
		}
	}
	if code, _ := get("GET", "/ready"); code != 404 {
		t.Errorf("GET /ready = %d, want 404 (one readiness path)", code)
	}
	if code, _ := get("POST", ReadyPath); code != 405 {
		t.Errorf("POST = %d, want 405", code)
	}
	if p := NewReadiness(Task{Name: "never"}).Pending(); len(p) != 1 {
		t.Errorf("a task without Ready is done: %v", p)
	}
}

func TestListenServeShutdown(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	s, err := Listen(zap.NewNop(),
		Spec{Name: "admin", Addr: "localhost:0", Handler: ok},
		Spec{Name: "readiness", Addr: "127.0.0.1:0", Exposure: Public, Handler: ok},
		Spec{Name: "metrics", Addr: "", Exposure: Public, Handler: ok},
	)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Addrs("metrics")) != 0 {
		t.Errorf("disabled server bound %v", s.Addrs("metrics"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	for _, name := range []string{"admin", "readiness"} {
		for _, a := range s.Addrs(name) {
			ip := a.(*net.TCPAddr).IP
			if !ip.IsLoopback() {
				t.Errorf("%s bound %s", name, a)
			}
			resp, err := http.Get("http://" + a.String() + "/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("%s on %s = %d", name, a, resp.StatusCode)
			}
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

func TestDebugLoopbackOnly(t *testing.T) {
	ok := http.NotFoundHandler()
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", ":0", "10.1.2.3:0", "192.0.2.2:0", "example.com:0", "8000"} {
		if s, err := Listen(nil, Spec{Name: "admin", Addr: addr, Handler: ok}); err == nil {
			s.Close()
			t.Errorf("debug server on %q accepted", addr)
		} else if ValidateAddr(addr, true) == nil {
			t.Errorf("ValidateAddr(%q) accepts what Listen refuses (%v)", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "localhost:0"} {
		if err := ValidateAddr(addr, true); err != nil {
			t.Errorf("ValidateAddr(%q) = %v", addr, err)
		}
	}
	if err := ValidateAddr(":15020", false); err != nil {
		t.Errorf("public wildcard refused: %v", err)
	}
}

func TestListenConflictLeavesNothingBound(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ok := http.NotFoundHandler()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	_, err = Listen(nil, Spec{Name: "readiness", Addr: freeAddr, Exposure: Public, Handler: ok},
		Spec{Name: "metrics", Addr: l.Addr().String(), Exposure: Public, Handler: ok})
	if err == nil || !strings.Contains(err.Error(), "metrics server") {
		t.Fatalf("conflict: err = %v", err)
	}
	again, err := net.Listen("tcp", freeAddr)
	if err != nil {
		t.Fatalf("the first server stayed bound after the second failed: %v", err)
	}
	again.Close()
}

func TestDebugHandlersLogging(t *testing.T) {
	level := zap.NewAtomicLevelAt(zapcore.InfoLevel)
	mux := http.NewServeMux()
	DebugHandlers(mux, level)
	do := func(method, target string) (int, string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := do("GET", "/logging"); code != 200 || body != "current log level is info\n" {
		t.Errorf("GET = %d %q", code, body)
	}
	if code, _ := do("GET", "/logging?level=debug"); code != 405 || level.Level() != zapcore.InfoLevel {
		t.Errorf("GET ?level = %d, level %v: a link must not change it", code, level.Level())
	}
	if code, _ := do("POST", "/logging?level=debug"); code != 200 || level.Level() != zapcore.DebugLevel {
		t.Errorf("POST ?level=debug = %d, level %v", code, level.Level())
	}
	if code, _ := do("POST", "/logging?level=loud"); code != 400 {
		t.Errorf("POST ?level=loud = %d", code)
	}
	if code, _ := do("POST", "/logging?reset"); code != 200 || level.Level() != zapcore.InfoLevel {
		t.Errorf("POST ?reset = %d, level %v", code, level.Level())
	}
	if code, body := do("GET", "/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("pprof index = %d %.100q", code, body)
	}
	if code, body := do("GET", "/debug/pprof/goroutine?debug=1"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("goroutine profile = %d %.100q", code, body)
	}
	if code, _ := do("GET", "/debug/pprof/nosuch"); code != 404 {
		t.Errorf("unknown profile = %d", code)
	}
}
