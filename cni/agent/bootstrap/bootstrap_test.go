package bootstrap

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

// TestServersSplitDebugFromPublic: /pods, /logging and pprof only on the
// loopback Debug server, which routes nothing but GET /pods to the agent's
// handler (so the agent's own /ready stays unexposed); readiness serves
// /healthz/ready and nothing else.
func TestServersSplitDebugFromPublic(t *testing.T) {
	pods := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "agent "+r.URL.Path) })
	ready := false
	specs := Servers(Options{AdminAddr: DefaultAdminAddr, ReadinessAddr: DefaultReadinessAddr}, pods, zap.NewAtomicLevel(),
		daemon.NewReadiness(daemon.Task{Name: TaskAgent, Ready: func() bool { return ready }}))
	by := map[string]daemon.Spec{}
	for _, s := range specs {
		by[s.Name] = s
	}
	if by["admin"].Exposure != daemon.Debug || by["readiness"].Exposure != daemon.Public || len(specs) != 2 {
		t.Fatalf("specs: %+v", specs)
	}
	get := func(server, path string) (int, string) {
		rec := httptest.NewRecorder()
		by[server].Handler.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	for _, tc := range []struct {
		server, path string
		code         int
		body         string
	}{
		{"admin", "/pods", 200, "agent /pods"},
		{"admin", "/ready", 404, ""},
		{"admin", "/logging", 200, "current log level"},
		{"admin", "/debug/pprof/", 200, "goroutine"},
		{"readiness", "/healthz/ready", 503, "not ready, pending: node agent"},
		{"readiness", "/pods", 404, ""},
		{"readiness", "/debug/pprof/", 404, ""},
	} {
		if code, body := get(tc.server, tc.path); code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("%s GET %s = %d %.80q, want %d with %q", tc.server, tc.path, code, body, tc.code, tc.body)
		}
	}
	ready = true
	if code, _ := get("readiness", "/healthz/ready"); code != 200 {
		t.Errorf("ready agent: %d", code)
	}
}

func TestValidate(t *testing.T) {
	base := Options{NodeName: "n1", LocalConfig: "/d"}
	for _, tc := range []struct {
		mutate func(*Options)
		err    string
	}{
		{func(*Options) {}, ""},
		{func(o *Options) { o.AdminAddr, o.ReadinessAddr = DefaultAdminAddr, DefaultReadinessAddr }, ""},
		{func(o *Options) { o.AdminAddr = "[::]:8000" }, "loopback only"},
		{func(o *Options) { o.AdminAddr = "10.0.0.1:8000" }, "loopback only"},
		{func(o *Options) { o.ReadinessAddr = "10.0.0.1:8001" }, ""},
		{func(o *Options) { o.ReadinessAddr = "host:8001" }, "--readiness-addr"},
		{func(o *Options) { o.NodeName = "" }, "--node-name"},
	} {
		o := base
		tc.mutate(&o)
		err := o.Validate()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: %v, want %q", o, err, tc.err)
		}
	}
}
