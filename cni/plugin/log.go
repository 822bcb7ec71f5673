package plugin

import (
	"bytes"
	"context"
	"net/http"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger logs to stderr and, best effort, to the agent (POST PathLog, one
// LogEntry per line), every line tagged with the pod.
func newLogger(conf *Config, pa podArgs, containerID string) *zap.Logger {
	level, err := zap.ParseAtomicLevel(conf.LogLevel)
	if err != nil {
		level = zap.NewAtomicLevelAt(zap.InfoLevel) // ParseConfig validated it
	}
	enc := zapcore.EncoderConfig{
		TimeKey:        "time",
		LevelKey:       "level",
		MessageKey:     "msg",
		EncodeTime:     zapcore.RFC3339NanoTimeEncoder,
		EncodeLevel:    zapcore.LowercaseLevelEncoder,
		EncodeDuration: zapcore.StringDurationEncoder,
	}
	core := zapcore.NewTee(
		zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(os.Stderr), level),
		zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(&agentLogSink{socket: conf.AgentSocket}), level),
	)
	return zap.New(core).Named("ztunnel-cni").With(
		zap.String("pod", pa.Name), zap.String("namespace", pa.Namespace), zap.String("container", containerID))
}

// agentLogSink posts each log line to the agent and ignores failures: an
// absent agent must not slow the plugin (a missing socket fails at once).
type agentLogSink struct {
	socket string
}

func (s *agentLogSink) Write(p []byte) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), logTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://unix"+PathLog, bytes.NewReader(bytes.TrimSpace(p)))
	if err != nil {
		return len(p), nil
	}
	req.Header.Set("Content-Type", "application/json")
	if resp, err := agentClient(s.socket, logTimeout).Do(req); err == nil {
		resp.Body.Close()
	}
	return len(p), nil
}
