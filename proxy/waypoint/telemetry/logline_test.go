package telemetry

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
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

type fixedClock time.Time

func (c fixedClock) Now() time.Time                         { return time.Time(c) }
func (c fixedClock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }

// TestJSONLinesSameAsAccessLogger: with UseJSONLines the access log has
// the lines the zap access logger writes, byte for byte, for TCP and HTTP
// requests, denials, dry runs, JWT principals, mirrors and odd bytes; a
// request with an error still goes through the zap logger.
func TestJSONLinesSameAsAccessLogger(t *testing.T) {
	at := time.Date(2026, 12, 6, 9, 0, 0, 5e6, time.UTC)
	var entries []*Entry
	tcp := entry(t, false)
	tcp.Src, tcp.Dst = netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("[fd00::2]:8080")
	entries = append(entries, tcp)
	ok := entry(t, true)
	ok.Attrs.Method, ok.Attrs.Path, ok.Attrs.Host = "POST", "/api/echo?q=\"x\"\n", "server.demo"
	ok.Route, ok.Upstream, ok.Duration, ok.Sizes = "demo.route.0", "10.0.0.2:8080", 1234567*time.Nanosecond, Sizes{Request: 1024, Response: 7}
	entries = append(entries, ok)
	routed := entry(t, true) // as the waypoint records one: how, and where
	routed.Upstream, routed.UpstreamTo = "hbone", netip.MustParseAddrPort("[fd00::3]:9080")
	entries = append(entries, routed)
	denied := entry(t, true)
	denied.Code, denied.Verdict = 403, &stream.Verdict{Policy: "demo/deny-admin", Reason: "denied by demo/deny-admin", DryRun: []string{"demo/a", "demo/\xffb"}}
	denied.Attrs.Auth = &stream.RequestAuth{Principal: "https://issuer/sub"}
	denied.Mirror, denied.Flags = "mirror.demo", "UAEX"
	entries = append(entries, denied)
	failed := entry(t, true)
	failed.Code, failed.Err, failed.Flags = 503, errors.New("upstream reset"), "UF"
	entries = append(entries, failed)

	logger := func(out *bytes.Buffer) *zap.Logger {
		l, _, err := daemon.NewLogger(daemon.LogConfig{Output: out})
		if err != nil {
			t.Fatal(err)
		}
		return l.WithOptions(zap.WithCaller(false), zap.WithClock(fixedClock(at))).Named("access")
	}
	var viaZap, viaLines, errLines bytes.Buffer
	zr, err := New(nil, logger(&viaZap), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	lr, err := New(nil, logger(&errLines), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	lr.UseJSONLines(&daemon.JSONLines{Name: "access", Level: zap.NewAtomicLevel(), Out: &viaLines, Now: func() time.Time { return at }})
	for _, ex := range entries {
		zr.Record(ex)
		lr.Record(ex)
	}
	zl := strings.SplitAfter(viaZap.String(), "\n")
	got := viaLines.String() + errLines.String() // the error line last
	if want := strings.Join(zl[:4], "") + zl[4]; got != want {
		t.Errorf("JSONLines wrote\n%s\nthe access logger\n%s", got, want)
	}
	if !strings.Contains(got, `"upstream":"hbone [fd00::3]:9080"`) {
		t.Errorf("no upstream field of how and where in %s", got)
	}
	if !strings.Contains(errLines.String(), `"error":"upstream reset"`) {
		t.Errorf("the error line did not go through zap: %q", errLines.String())
	}
}
