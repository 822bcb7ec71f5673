package telemetry

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestLogLineFieldsNotCarried: the access-log fields come from a pool; a
// line has its own request's fields only, none left from the line before.
func TestLogLineFieldsNotCarried(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	rec, err := New(prometheus.NewRegistry(), zap.New(core), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	first := entry(t, true)
	first.Mirror, first.Err = "mirror.demo", errors.New("upstream reset")
	first.Attrs.Method, first.Attrs.Path = "POST", "/first"
	first.Verdict.Reason = "allowed by demo/allow"
	rec.Record(first)
	second := entry(t, true)
	second.Attrs.Method, second.Attrs.Path = "GET", "/second"
	rec.Record(second)

	lines := logs.All()
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2", len(lines))
	}
	f, s := lines[0].ContextMap(), lines[1].ContextMap()
	for _, k := range []string{"mirror", "error", "authz.reason"} {
		if _, ok := f[k]; !ok {
			t.Errorf("first line has no %s: %v", k, f)
		}
		if v, ok := s[k]; ok {
			t.Errorf("second line has %s=%v from the first", k, v)
		}
	}
	if s["path"] != "/second" || s["method"] != "GET" || f["path"] != "/first" {
		t.Errorf("paths %v and %v, want /first and /second", f["path"], s["path"])
	}
}
