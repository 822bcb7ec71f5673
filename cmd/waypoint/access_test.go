package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestAccessLogger: access lines are buffered (not written one by one),
// flushed whole by stop, named "access", and follow the daemon's level.
func TestAccessLogger(t *testing.T) {
	level := zap.NewAtomicLevelAt(zapcore.InfoLevel)
	out := &lockedBuffer{}
	a, err := accessLogger(daemon.LogConfig{Level: zapcore.InfoLevel}, level, zapcore.AddSync(out))
	if err != nil {
		t.Fatal(err)
	}
	l, stop := a.log, a.stop
	l.Info("request", zap.Int("code", 200))
	l.Debug("request", zap.Int("code", 201))
	if got := out.String(); got != "" {
		t.Fatalf("written before a flush: %q", got)
	}
	level.SetLevel(zapcore.WarnLevel)
	l.Info("request", zap.Int("code", 202))
	level.SetLevel(zapcore.DebugLevel)
	l.Debug("request", zap.Int("code", 203))
	stop()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"code":200`) || !strings.Contains(lines[1], `"code":203`) {
		t.Fatalf("lines %q, want the info line at info and the debug line at debug only", lines)
	}
	if !strings.Contains(lines[0], `"logger":"access"`) || !strings.Contains(lines[0], `"msg":"request"`) {
		t.Errorf("line %q, want logger access and msg request", lines[0])
	}
}

// TestAccessLinesShareTheLog: with the JSON format the request lines come
// from lines, into the same buffer (flushed by stop) and under the same
// level; with the console format there is none.
func TestAccessLinesShareTheLog(t *testing.T) {
	level := zap.NewAtomicLevelAt(zapcore.InfoLevel)
	out := &lockedBuffer{}
	a, err := accessLogger(daemon.LogConfig{Level: zapcore.InfoLevel}, level, zapcore.AddSync(out))
	if err != nil {
		t.Fatal(err)
	}
	if a.lines == nil || !a.lines.Enabled() {
		t.Fatal("no JSON lines at info with the JSON format")
	}
	a.lines.Info("request").Int("code", 200).Write()
	if got := out.String(); got != "" {
		t.Fatalf("written before a flush: %q", got)
	}
	level.SetLevel(zapcore.WarnLevel)
	if a.lines.Enabled() {
		t.Error("JSON lines enabled at warn")
	}
	a.stop()
	if got := out.String(); !strings.Contains(got, `"logger":"access","msg":"request","code":200}`) {
		t.Errorf("flushed %q", got)
	}
	c, err := accessLogger(daemon.LogConfig{Format: daemon.FormatConsole}, level, zapcore.AddSync(out))
	if err != nil {
		t.Fatal(err)
	}
	defer c.stop()
	if c.lines != nil {
		t.Error("JSON lines with the console format")
	}
}
