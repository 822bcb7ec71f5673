package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

// TestLogLevel drives zctl log against the daemons' real /logging handler.
func TestLogLevel(t *testing.T) {
	level := zap.NewAtomicLevelAt(zapcore.InfoLevel)
	mux := http.NewServeMux()
	daemon.DebugHandlers(mux, level)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	zctl := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(append([]string{"log", "--admin", addr}, args...), &out, &out)
		return out.String(), err
	}
	out, err := zctl()
	if err != nil || !strings.Contains(out, "# proxy: admin http://"+addr+"/logging\n") || !strings.Contains(out, "default  info") {
		t.Fatalf("read: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		arg  string
		want zapcore.Level
	}{{"debug", zapcore.DebugLevel}, {"default:warn", zapcore.WarnLevel}, {"default:error,error", zapcore.ErrorLevel}} {
		out, err := zctl("--level", tc.arg)
		if err != nil || level.Level() != tc.want || !strings.Contains(out, "default  "+tc.want.String()) {
			t.Errorf("--level %s: %v, level %s\n%s", tc.arg, err, level.Level(), out)
		}
	}
	for _, bad := range []string{"xds:debug", "debug,proxy:info", "default:debug,default:info", "default:"} {
		if _, err := zctl("--level", bad); err == nil {
			t.Errorf("--level %s accepted", bad)
		} else if level.Level() != zapcore.ErrorLevel {
			t.Errorf("--level %s changed the level to %s", bad, level.Level())
		}
	}
	if _, err := zctl("--level", "xds:debug"); err == nil || !strings.Contains(err.Error(), "one log level per process") {
		t.Errorf("unknown scope: %v", err)
	}
	if _, err := zctl("--level", "loud"); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("a level the proxy refuses: %v", err)
	}
	out, err = zctl("--reset", "-o", "json")
	var l logLevel
	if err != nil || json.Unmarshal([]byte(out), &l) != nil || l.Level != "info" || l.Scopes[defaultScope] != "info" ||
		l.Proxy != "admin http://"+addr+"/logging" || level.Level() != zapcore.InfoLevel {
		t.Errorf("--reset -o json: %v %+v\n%s", err, l, out)
	}
	if _, err := zctl("--reset", "--level", "debug"); err == nil {
		t.Error("--reset with --level accepted")
	}
}
