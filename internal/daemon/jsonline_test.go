package daemon

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

type fixedClock time.Time

func (c fixedClock) Now() time.Time                         { return time.Time(c) }
func (c fixedClock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }

// TestJSONLinesMatchZap: a JSONLines line is byte for byte what a NewLogger
// JSON logger of the same name writes for the same fields, escapes
// included, and nothing is written while the level is above info.
func TestJSONLinesMatchZap(t *testing.T) {
	at := time.Date(2026, 12, 6, 8, 30, 1, 234567891, time.UTC)
	odd := []string{"", "plain", `quote " and \ back`, "new\nline\r\ttab", "\x00\x01\x1f\x7f", "héllo ✓ 🙂",
		"bad \xff utf8 \xc3", "</script>&amp;", "spiffe://cluster.local/ns/a/sa/b"}
	durations := []time.Duration{0, time.Nanosecond, 1500 * time.Microsecond, 2 * time.Second, -time.Millisecond, 90 * time.Minute}
	for _, name := range []string{"access", "", "a\"b"} {
		for i, s := range odd {
			d := durations[i%len(durations)]
			var zb, jb bytes.Buffer
			level := zap.NewAtomicLevelAt(zapcore.InfoLevel)
			zl, _, err := NewLogger(LogConfig{Output: &zb})
			if err != nil {
				t.Fatal(err)
			}
			zl = zl.WithOptions(zap.WithCaller(false), zap.WithClock(fixedClock(at)))
			if name != "" {
				zl = zl.Named(name)
			}
			zl.Info(s, zap.String(s, s), zap.String("k", "v"), zap.Int64("n", int64(i)*-12345), zap.Int("code", 200),
				zap.Bool("t", i%2 == 0), zap.Duration("duration", d), zap.Strings("list", odd[:i]), zap.Strings("empty", nil))
			j := &JSONLines{Name: name, Level: level, Out: &jb, Now: func() time.Time { return at }}
			j.Info(s).String(s, s).String("k", "v").Int("n", int64(i)*-12345).Int("code", 200).
				Bool("t", i%2 == 0).Duration("duration", d).Strings("list", odd[:i]).Strings("empty", nil).Write()
			if zb.String() != jb.String() {
				t.Errorf("logger %q, field %q:\n zap  %s JSONLines %s", name, s, zb.String(), jb.String())
			}
		}
	}
	j := &JSONLines{Level: zap.NewAtomicLevelAt(zapcore.WarnLevel)}
	if j.Enabled() {
		t.Error("enabled at warn")
	}
	j.Level.SetLevel(zapcore.DebugLevel)
	if !j.Enabled() {
		t.Error("not enabled at debug")
	}
}

func BenchmarkAccessLine(b *testing.B) {
	fields := func(l *JSONLine) {
		l.String("src.addr", "10.0.0.1:45678").String("src.identity", "spiffe://cluster.local/ns/a/sa/client").
			String("src.workload", "client-7d9f").String("dst.addr", "10.0.0.2:8080").String("dst.service", "server.b.svc.cluster.local").
			String("dst.workload", "server-1").String("upstream", "10.0.0.2:8080").String("protocol", "http").Int("code", 200).
			String("flags", "-").Duration("duration", 312*time.Microsecond).String("method", "POST").String("path", "/api/echo").
			String("host", "server.b").String("route", "b.echo.0").Int("bytes.request", 1024).Int("bytes.response", 1024)
	}
	b.Run("zap", func(b *testing.B) {
		zl, _, _ := NewLogger(LogConfig{Output: discard{}})
		zl = zl.WithOptions(zap.WithCaller(false)).Named("access")
		b.ReportAllocs()
		for b.Loop() {
			zl.Info("request", zap.String("src.addr", "10.0.0.1:45678"), zap.String("src.identity", "spiffe://cluster.local/ns/a/sa/client"),
				zap.String("src.workload", "client-7d9f"), zap.String("dst.addr", "10.0.0.2:8080"), zap.String("dst.service", "server.b.svc.cluster.local"),
				zap.String("dst.workload", "server-1"), zap.String("upstream", "10.0.0.2:8080"), zap.String("protocol", "http"), zap.Int("code", 200),
				zap.String("flags", "-"), zap.Duration("duration", 312*time.Microsecond), zap.String("method", "POST"), zap.String("path", "/api/echo"),
				zap.String("host", "server.b"), zap.String("route", "b.echo.0"), zap.Int64("bytes.request", 1024), zap.Int64("bytes.response", 1024))
		}
	})
	b.Run("JSONLines", func(b *testing.B) {
		j := &JSONLines{Name: "access", Level: zap.NewAtomicLevel(), Out: discard{}}
		b.ReportAllocs()
		for b.Loop() {
			l := j.Info("request")
			fields(l)
			l.Write()
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) Sync() error                 { return nil }

// TestJSONLineAddrPort: AddrPort writes what String of a.String() writes.
func TestJSONLineAddrPort(t *testing.T) {
	for _, a := range []netip.AddrPort{{}, netip.MustParseAddrPort("10.0.0.1:80"), netip.MustParseAddrPort("[fd00::2]:8080"),
		netip.MustParseAddrPort("[::ffff:10.0.0.1]:1"), netip.MustParseAddrPort("[fe80::1%eth\"0]:9")} {
		var want, got bytes.Buffer
		j := &JSONLines{Level: zap.NewAtomicLevel(), Now: func() time.Time { return time.Time{} }}
		j.Out = &want
		j.Info("m").String("a", a.String()).Write()
		j.Out = &got
		j.Info("m").AddrPort("a", a).Write()
		if got.String() != want.String() {
			t.Errorf("%v: AddrPort wrote %s, String %s", a, got.String(), want.String())
		}
		for _, prefix := range []string{"hbone", "", "a\"b\n\u00e9"} {
			want.Reset()
			got.Reset()
			j.Out = &want
			j.Info("m").String("a", prefix+" "+a.String()).Write()
			j.Out = &got
			j.Info("m").AddrPortAfter("a", prefix, a).Write()
			if got.String() != want.String() {
				t.Errorf("%q %v: AddrPortAfter wrote %s, String %s", prefix, a, got.String(), want.String())
			}
		}
	}
}

// TestAppendSeconds: the same text as strconv.AppendFloat of the seconds,
// for durations of every size and sign.
func TestAppendSeconds(t *testing.T) {
	check := func(d time.Duration) {
		t.Helper()
		want := strconv.FormatFloat(float64(d)/float64(time.Second), 'f', -1, 64)
		if got := string(appendSeconds(nil, d)); got != want {
			t.Fatalf("%d ns: %s, AppendFloat %s", int64(d), got, want)
		}
	}
	for _, d := range []time.Duration{0, 1, -1, 9, 10, 999999999, 1e9, 1e9 + 1, -1e9 - 1, 1e15 - 1, 1e15, -1e15 + 1, -1e15,
		1<<53 - 1, 1 << 53, 1<<63 - 1, -1 << 63, 123456789012345, 987654321098765} {
		check(d)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300000 {
		// Every magnitude from nanoseconds to centuries, both signs.
		d := time.Duration(rng.Int64N(int64(1) << rng.IntN(63)))
		if rng.IntN(2) == 0 {
			d = -d
		}
		check(d)
	}
}
