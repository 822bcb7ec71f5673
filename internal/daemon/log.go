// Package daemon is the runtime skeleton the four daemons (ztunnel,
// ztunnel-cp, ztunnel-cni, waypoint) share, so that an operator meets one
// convention everywhere:
//
//   - logs: the same --log-level and --log-format json|console flags and the
//     same zap encoding (NewLogger);
//   - goroutines: every long-lived one is a named task of a Group, which
//     stops the daemon on the first error (logged once, with the task's
//     name) and stops the tasks in the reverse order of their start;
//   - retries: every retry loop waits out a backoff.Retry (jitter, a cap,
//     one log line per backoff step);
//   - readiness: GET /healthz/ready, 200 "ready\n" or 503 "not ready,
//     pending: <tasks>" (Readiness), followed by the failing retry loops;
//   - HTTP servers: Listen binds every configured server at once (a port
//     conflict fails the start), Serve serves until the context ends and
//     then shuts down gracefully; a Debug server binds loopback only, a
//     Public one (readiness, metrics) may bind any address;
//   - the debug endpoints every admin server carries: /logging and
//     /debug/pprof/ (DebugHandlers).
//
// It is not a configuration source: it parses no environment and knows no
// binary's endpoints beyond those; each main decides what to serve where.
package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Log formats.
const (
	FormatJSON    = "json"
	FormatConsole = "console"
)

// Flag names shared by every daemon.
const (
	FlagLogLevel  = "log-level"
	FlagLogFormat = "log-format"
)

// LogFlags are --log-level and --log-format. Register them on a FlagSet,
// parse, then call Config.
type LogFlags struct {
	Level  string
	Format string
}

// Register adds --log-level and --log-format to fs with the given defaults
// ("" means info and json).
func (f *LogFlags) Register(fs *flag.FlagSet, defLevel, defFormat string) {
	if defLevel == "" {
		defLevel = "info"
	}
	if defFormat == "" {
		defFormat = FormatJSON
	}
	fs.StringVar(&f.Level, FlagLogLevel, defLevel, "log level: debug, info, warn or error")
	fs.StringVar(&f.Format, FlagLogFormat, defFormat, "log format: json or console")
}

// Config validates the flags (naming the bad one) and returns the logger
// configuration.
func (f LogFlags) Config() (LogConfig, error) {
	lvl, err := ParseLevel(f.Level)
	if err != nil {
		return LogConfig{}, fmt.Errorf("--%s: %w", FlagLogLevel, err)
	}
	format, err := ParseFormat(f.Format)
	if err != nil {
		return LogConfig{}, fmt.Errorf("--%s: %w", FlagLogFormat, err)
	}
	return LogConfig{Level: lvl, Format: format}, nil
}

// ParseLevel parses a log level: debug, info, warn (or warning) or error,
// any case. "trace" is debug (zap's finest level), as the node proxy's
// Istio-style RUST_LOG may say it.
func ParseLevel(s string) (zapcore.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "trace", "debug":
		return zapcore.DebugLevel, nil
	case "info":
		return zapcore.InfoLevel, nil
	case "warn", "warning":
		return zapcore.WarnLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	}
	return zapcore.InfoLevel, fmt.Errorf("unknown level %q: want debug, info, warn or error", s)
}

// ParseFormat parses a log format: json or console ("plain", Istio
// ztunnel's name for its non-JSON format, is console).
func ParseFormat(s string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case FormatJSON:
		return FormatJSON, nil
	case FormatConsole, "plain":
		return FormatConsole, nil
	}
	return "", fmt.Errorf("unknown format %q: want json or console", s)
}

// LogConfig is a logger's configuration.
type LogConfig struct {
	Level zapcore.Level
	// Format is FormatJSON or FormatConsole; "" means JSON.
	Format string
	// Output receives the log lines; nil means standard error.
	Output io.Writer
}

// NewLogger builds the logger every daemon uses: the level is an atomic
// level (returned, for the admin server's /logging), never sampled (an
// access-log line is never dropped), no stack traces below panic (a refused
// connection is not a crash), ISO 8601 times under "time".
func NewLogger(c LogConfig) (*zap.Logger, zap.AtomicLevel, error) {
	level := zap.NewAtomicLevelAt(c.Level)
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey, ec.EncodeTime = "time", encodeISO8601
	var enc zapcore.Encoder
	switch c.Format {
	case "", FormatJSON:
		enc = zapcore.NewJSONEncoder(ec)
	case FormatConsole:
		enc = zapcore.NewConsoleEncoder(ec)
	default:
		return nil, level, errors.New("daemon: log format must be json or console, not " + c.Format)
	}
	var out zapcore.WriteSyncer = zapcore.Lock(os.Stderr)
	if c.Output != nil {
		out = zapcore.AddSync(c.Output)
	}
	log := zap.New(zapcore.NewCore(enc, out, level),
		zap.ErrorOutput(out), zap.AddCaller(), zap.AddStacktrace(zapcore.PanicLevel))
	return log, level, nil
}
