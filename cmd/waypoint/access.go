package main

import (
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

// accessLogger is the access log (one line per request): the daemon's
// logger whose lines go to out through a 64 KiB buffer written when full and
// at least every second, as Envoy buffers its access log (64 KiB,
// access_log_flush_interval 1 s). A write per line was half of the log's
// cost at 1k req/s (bench/waypoint), and a write per 4 KiB still 6 % of the
// waypoint's CPU there. out must be the main log's writer too (main shares
// one lock between them): a write above PIPE_BUF is not atomic on a pipe.
// Its level follows level (the admin's /logging). stop flushes it.
// With the JSON format its request lines come from lines, which writes
// the same bytes at a third of zap's cost; nil with the console format.
func accessLogger(lc daemon.LogConfig, level zap.AtomicLevel, out zapcore.WriteSyncer) (*accessLog, error) {
	buf := &zapcore.BufferedWriteSyncer{WS: out, Size: 64 << 10, FlushInterval: time.Second}
	alc := lc
	alc.Level, alc.Output = zapcore.DebugLevel, buf
	l, _, err := daemon.NewLogger(alc)
	if err != nil {
		return nil, err
	}
	// No caller: it is always record's line, and finding it (a stack
	// walk per line) was 5 % of the waypoint's CPU at 1k req/s.
	l = l.WithOptions(zap.WithCaller(false), zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		if lc, err := zapcore.NewIncreaseLevelCore(c, level); err == nil {
			return lc
		}
		return c
	}))
	a := &accessLog{log: l.Named("access"), stop: func() { _ = buf.Stop() }}
	if lc.Format == "" || lc.Format == daemon.FormatJSON {
		a.lines = &daemon.JSONLines{Name: "access", Level: level, Out: buf}
	}
	return a, nil
}

// accessLog is the access log's two writers and its flush.
type accessLog struct {
	log   *zap.Logger
	lines *daemon.JSONLines
	stop  func()
}
