package bootstrap

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/xdsserver"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

type fakeDump struct{ xds *xdsserver.Server }

func (fakeDump) ConfigDump() controlplane.ConfigDump { return controlplane.ConfigDump{Generation: 7} }
func (f fakeDump) XDS() *xdsserver.Server            { return f.xds }

// TestServersSplitDebugFromPublic: the config dump, /logging and pprof are
// only on the Debug server; the public ones serve metrics or readiness and
// nothing else.
func TestServersSplitDebugFromPublic(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "test_total", Help: "t"})
	c.Inc()
	reg.MustRegister(c)
	o := Options{AdminAddr: DefaultAdminAddr, MetricsAddr: DefaultMetricsAddr, ReadinessAddr: DefaultReadinessAddr}
	specs := Servers(o, fakeDump{xdsserver.NewServer(xdsserver.ServerConfig{})}, reg, zap.NewAtomicLevel(), daemon.NewReadiness())
	by := map[string]daemon.Spec{}
	for _, s := range specs {
		by[s.Name] = s
	}
	if by["admin"].Exposure != daemon.Debug || by["metrics"].Exposure != daemon.Public || by["readiness"].Exposure != daemon.Public {
		t.Fatalf("exposures: %+v", specs)
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
		{"admin", "/config_dump", 200, `"generation": 7`},
		{"admin", "/metrics", 200, "test_total 1"},
		{"admin", "/debug/syncz", 200, `"streams": []`},
		{"admin", "/logging", 200, "current log level"},
		{"admin", "/debug/pprof/", 200, "goroutine"},
		{"metrics", "/metrics", 200, "test_total 1"},
		{"metrics", "/config_dump", 404, ""},
		{"metrics", "/debug/pprof/", 404, ""},
		{"metrics", "/debug/syncz", 404, ""},
		{"metrics", "/logging", 404, ""},
		{"readiness", "/healthz/ready", 200, "ready\n"},
		{"readiness", "/config_dump", 404, ""},
	} {
		if code, body := get(tc.server, tc.path); code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("%s GET %s = %d %.80q, want %d with %q", tc.server, tc.path, code, body, tc.code, tc.body)
		}
	}
}

func TestValidateRefusesDebugOffLoopback(t *testing.T) {
	base := Options{ConfigDir: "/d", Listen: "127.0.0.1:15012"}
	for _, tc := range []struct {
		mutate func(*Options)
		err    string
	}{
		{func(o *Options) {}, ""},
		{func(o *Options) { o.AdminAddr = "[::1]:15014" }, ""},
		{func(o *Options) { o.AdminAddr = "0.0.0.0:15014" }, "--admin"},
		{func(o *Options) { o.MetricsAddr = "0.0.0.0:15015" }, ""},
		{func(o *Options) { o.MetricsAddr = "metrics" }, "--metrics-addr"},
		{func(o *Options) { o.Listen = "" }, "--listen"},
	} {
		o := base
		tc.mutate(&o)
		err := o.Validate()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: %v, want %q", o, err, tc.err)
		}
	}
}
