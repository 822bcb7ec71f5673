package agent

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/cni/agent/install"
	"github.com/ztunnel-go/ztunnel-go/cni/runtimecfg"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestAgentNotReadyUntilPluginInstalled: an agent whose chained plugin is
// not installed where the runtime reads its CNI config answers 503 on
// /ready, naming why, however well the rest of it runs; it turns Ready
// only once the plugin is copied and chained.
//
// The node: containerd's config (under a fake host root) names conf dir
// runtime/net.d, where the primary network's conflist is. First the agent
// is told another conf dir (the chart's old fixed /etc/cni/net.d, empty on
// this node): not Ready, and the reason names that directory and where it
// came from. Then it reads the runtime's config instead: Ready, with the
// plugin at the end of the runtime's conflist and in its bin dir. A writer
// that rewrites the conflist without our entry gets it put back.
func TestAgentNotReadyUntilPluginInstalled(t *testing.T) {
	root := t.TempDir()
	mkdir := func(p string) string {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	runtimeBin, runtimeConf, wrongConf := mkdir("/var/lib/node/cni/bin"), mkdir("/var/lib/node/cni/net.d"), mkdir("/etc/cni/net.d")
	mkdir("/etc/containerd")
	if err := os.WriteFile(filepath.Join(root, "/etc/containerd/config.toml"), []byte(`version = 2
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "`+runtimeBin+`"
  conf_dir = "`+runtimeConf+`"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	primary := filepath.Join(root, runtimeConf, "10-bridge.conflist")
	const bridgeOnly = `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge"}]}`
	if err := os.WriteFile(primary, []byte(bridgeOnly), 0o644); err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(t.TempDir(), "ztunnel-cni")
	if err := os.WriteFile(binary, []byte("plugin binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	plugin := map[string]any{"name": install.PluginType, "agent_socket": "/var/run/ztunnel-cni/pluginevent.sock"}

	// run starts an agent whose readiness follows a Keeper of resolve.
	run := func(t *testing.T, resolve install.Resolver) (*Agent, func() (int, string)) {
		e := newEnv(t)
		e.src.set(ns("mesh", true))
		keeper := install.NewKeeper(install.Config{Binary: binary, Plugin: plugin}, resolve)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); keeper.Run(ctx, zap.NewNop()) }()
		t.Cleanup(func() { cancel(); <-done })
		cfg := e.config()
		cfg.PluginInstalled = keeper.Installed
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithCancel(context.Background())
		e.a, e.cancel, e.done = a, acancel, make(chan error, 1)
		go func() { e.done <- a.Run(actx) }()
		t.Cleanup(e.stop)
		testkit.Eventually(t, waitTimeout, "agent serving", a.Serving)
		srv := httptest.NewServer(a.AdminHandler())
		t.Cleanup(srv.Close)
		ready := func() (int, string) {
			resp, err := http.Get(srv.URL + "/ready")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
		return a, ready
	}

	t.Run("wrong conf dir", func(t *testing.T) {
		a, ready := run(t, func() (string, string, string, error) {
			return filepath.Join(root, runtimeBin), filepath.Join(root, wrongConf), "--cni-conf-dir", nil
		})
		// Several install attempts (one a second after a failure) pass.
		time.Sleep(2500 * time.Millisecond)
		code, body := ready()
		if code != http.StatusServiceUnavailable || a.Ready() {
			t.Fatalf("GET /ready = %d %q (Ready %v) with the plugin not installable, want 503", code, body, a.Ready())
		}
		for _, want := range []string{"CNI plugin is not installed", filepath.Join(root, wrongConf), "no CNI config", "from --cni-conf-dir"} {
			if !strings.Contains(body, want) {
				t.Errorf("GET /ready body %q does not name %q", body, want)
			}
		}
		if b, _ := os.ReadFile(primary); strings.Contains(string(b), install.PluginType) {
			t.Errorf("the runtime's conflist was chained by an agent pointed elsewhere: %s", b)
		}
	})

	t.Run("dirs from the runtime's config", func(t *testing.T) {
		a, ready := run(t, func() (string, string, string, error) {
			d, err := runtimecfg.Detect(runtimecfg.Options{Root: root, Proc: filepath.Join(root, "proc")})
			if err != nil {
				return "", "", "", err
			}
			return filepath.Join(root, d.BinDir()), filepath.Join(root, d.ConfDir), d.String(), nil
		})
		testkit.Eventually(t, waitTimeout, "agent ready", a.Ready)
		if code, body := ready(); code != http.StatusOK {
			t.Fatalf("GET /ready = %d %q once installed, want 200", code, body)
		}
		chained := func() bool {
			b, _ := os.ReadFile(primary)
			return strings.Contains(string(b), `"type": "`+install.PluginType+`"`)
		}
		if !chained() {
			t.Fatal("Ready, but the runtime's conflist does not chain the plugin")
		}
		if b, err := os.ReadFile(filepath.Join(root, runtimeBin, install.PluginType)); err != nil || string(b) != "plugin binary" {
			t.Fatalf("plugin binary in the runtime's bin dir: %q, %v", b, err)
		}

		// Another writer drops our entry: it is back, and the agent Ready.
		if err := os.WriteFile(primary, []byte(bridgeOnly), 0o644); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, waitTimeout, "entry re-chained and ready", func() bool { return chained() && a.Ready() })
	})
}
