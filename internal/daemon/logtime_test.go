package daemon

import (
	"bytes"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestEncodeISO8601: the cached encoder writes exactly what zap's
// ISO8601TimeEncoder writes, across milliseconds, seconds, zones and a DST
// change, in either order.
func TestEncodeISO8601(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip("no zoneinfo:", err)
	}
	base := time.Date(2026, 3, 8, 6, 59, 58, 0, time.UTC) // 01:59:58 EST, a DST start 2 s later
	var times []time.Time
	for _, d := range []time.Duration{0, time.Millisecond, 999 * time.Millisecond, time.Second, 1999 * time.Millisecond,
		2 * time.Second, 2*time.Second + 7*time.Millisecond, 3*time.Second + 500*time.Microsecond, -time.Hour} {
		for _, loc := range []*time.Location{time.UTC, ny, time.FixedZone("x", 5*3600+1800), time.Local} {
			times = append(times, base.Add(d).In(loc))
		}
	}
	times = append(times, times[0], time.Now(), time.Unix(0, 0).UTC())
	for _, tm := range times {
		got, want := encodeWith(t, encodeISO8601, tm), encodeWith(t, zapcore.ISO8601TimeEncoder, tm)
		if got != want {
			t.Errorf("%v: %s, zap writes %s", tm, got, want)
		}
	}
}

// encodeWith is the JSON line a logger with f as its time encoder writes
// for one entry at tm.
func encodeWith(t *testing.T, f zapcore.TimeEncoder, tm time.Time) string {
	t.Helper()
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = f
	buf, err := zapcore.NewJSONEncoder(ec).EncodeEntry(zapcore.Entry{Time: tm, Message: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return string(bytes.Clone(buf.Bytes()))
}

func BenchmarkEncodeTime(b *testing.B) {
	for _, c := range []struct {
		name string
		f    zapcore.TimeEncoder
	}{{"zap", zapcore.ISO8601TimeEncoder}, {"cached", encodeISO8601}} {
		b.Run(c.name, func(b *testing.B) {
			ec := zap.NewProductionEncoderConfig()
			ec.EncodeTime = c.f
			enc := zapcore.NewJSONEncoder(ec)
			tm := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				buf, _ := enc.EncodeEntry(zapcore.Entry{Time: tm, Message: "m"}, nil)
				buf.Free()
			}
		})
	}
}
