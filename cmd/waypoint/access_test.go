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
	l, stop, err := accessLogger(daemon.LogConfig{Level: zapcore.InfoLevel}, level, zapcore.AddSync(out))
	if err != nil {
		t.Fatal(err)
	}
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
