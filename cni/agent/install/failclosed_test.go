package install

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// runtimeChain is the plugin chain a container runtime runs for the conf
// dir: like containerd's go-cni and CRI-O's ocicni (libcni.ConfFiles, then
// the first file that loads), the lexically first of *.conf, *.conflist and
// *.json that parses, a single-plugin file being a chain of one.
func runtimeChain(t *testing.T, dir string) (string, []string) {
	t.Helper()
	file, chain, err := loadedChain(dir)
	if err != nil {
		t.Fatal(err)
	}
	return file, chain
}

// loadedChain is runtimeChain for callers that poll while the keeper
// writes: the listing and the reads are not one atomic step (a file listed
// may be gone by its read, as a runtime's listing may be), so finding
// nothing loadable is an error to retry, not a failure.
func loadedChain(dir string) (string, []string, error) {
	var files []string
	for _, ext := range []string{".conf", ".conflist", ".json"} {
		m, _ := filepath.Glob(filepath.Join(dir, "*"+ext))
		files = append(files, m...)
	}
	sort.Strings(files)
	for _, f := range files {
		if _, types, ok := chainOf(f); ok {
			return filepath.Base(f), types, nil
		}
	}
	return "", nil, fmt.Errorf("no loadable CNI config in %s (of %d files)", dir, len(files))
}

// chainOf loads one file as libcni does: a conflist's "plugins", or a
// single plugin's "type".
func chainOf(path string) (string, []string, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil, false
	}
	var c struct {
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if json.Unmarshal(data, &c) != nil {
		return "", nil, false
	}
	if strings.HasSuffix(path, ".conflist") {
		if len(c.Plugins) == 0 {
			return "", nil, false
		}
		var types []string
		for _, p := range c.Plugins {
			types = append(types, p.Type)
		}
		return filepath.Base(path), types, true
	}
	if c.Type == "" {
		return "", nil, false
	}
	return filepath.Base(path), []string{c.Type}, true
}

// TestFailClosedInstallPrimaryConf: the primary CNI wrote a single-plugin
// .conf, and a later-sorting .conflist exists too. The runtime uses the
// .conf, so that is where the plugin must go (converted to a conflist);
// when the primary CNI rewrites its .conf, the plugin is put back.
func TestFailClosedInstallPrimaryConf(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "self")
	if err := os.WriteFile(bin, []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	confDir := filepath.Join(dir, "net.d")
	os.MkdirAll(confDir, 0o755)
	const primaryConf = `{"cniVersion":"0.4.0","name":"k8s-pod-network","type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.1.0.0/24"}}`
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(confDir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10-flannel.conf", primaryConf)
	write("99-loopback.conflist", `{"cniVersion":"0.4.0","name":"lo","plugins":[{"type":"loopback"}]}`)
	cfg := Config{BinDir: filepath.Join(dir, "bin"), ConfDir: confDir, Binary: bin, Plugin: map[string]any{"agent_socket": "/run/x.sock"}}

	if _, err := Install(cfg); err != nil {
		t.Fatal(err)
	}
	file, chain := runtimeChain(t, confDir)
	if !slices.Equal(chain, []string{"bridge", PluginType}) {
		t.Fatalf("the runtime uses %s with chain %v: ambient pods would start uncaptured", file, chain)
	}
	if _, other := runtimeChainOf(t, filepath.Join(confDir, "99-loopback.conflist")); slices.Contains(other, PluginType) {
		t.Errorf("the plugin was added to a list the runtime does not use: %v", other)
	}

	// Another writer (the primary CNI's agent) rewrites its .conf.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Keep(ctx, cfg, zaptest.NewLogger(t)) }()
	defer func() { cancel(); <-done }()
	write("10-flannel.conf", primaryConf)
	testkit.EventuallyErr(t, 5*time.Second, "our plugin chained after the primary CNI rewrote its config", func() error {
		var err error
		if file, chain, err = loadedChain(confDir); err != nil {
			return err
		}
		if !slices.Equal(chain, []string{"bridge", PluginType}) {
			return fmt.Errorf("the runtime uses %s with chain %v", file, chain)
		}
		return nil
	})
	// And a rewrite of the converted conflist without our entry.
	write(file, `{"cniVersion":"0.4.0","name":"k8s-pod-network","plugins":[{"type":"bridge","bridge":"cni0"},{"type":"portmap"}]}`)
	testkit.EventuallyErr(t, 5*time.Second, "our plugin chained again after a rewrite of "+file, func() error {
		_, chain, err := loadedChain(confDir)
		if err != nil {
			return err
		}
		if !slices.Equal(chain, []string{"bridge", "portmap", PluginType}) {
			return fmt.Errorf("the runtime's chain is %v", chain)
		}
		return nil
	})

	cancel()
	<-done
	if err := Uninstall(cfg); err != nil {
		t.Fatal(err)
	}
	if _, chain := runtimeChain(t, confDir); slices.Contains(chain, PluginType) {
		t.Errorf("after uninstall the runtime's chain is %v", chain)
	}
}

func runtimeChainOf(t *testing.T, path string) (string, []string) {
	t.Helper()
	name, types, ok := chainOf(path)
	if !ok {
		t.Fatalf("%s does not load", path)
	}
	return name, types
}

// TestKeepSeesRewriteBeforeWatch: a primary config rewritten after the first
// attempt read the directory but before the watch began raises no event; the
// keeper must still chain again at once, not after KeepResync (a pod started
// in between would run uncaptured).
func TestKeepSeesRewriteBeforeWatch(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "self")
	if err := os.WriteFile(bin, []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	confDir := filepath.Join(dir, "net.d")
	os.MkdirAll(confDir, 0o755)
	const primaryConf = `{"cniVersion":"0.4.0","name":"k8s-pod-network","type":"bridge","bridge":"cni0"}`
	primary := filepath.Join(confDir, "10-flannel.conf")
	if err := os.WriteFile(primary, []byte(primaryConf), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{BinDir: filepath.Join(dir, "bin"), ConfDir: confDir, Binary: bin, Plugin: map[string]any{"agent_socket": "/run/x.sock"}}

	var once sync.Once
	afterAttempt = func() {
		once.Do(func() {
			if err := os.WriteFile(primary, []byte(primaryConf), 0o644); err != nil {
				t.Error(err)
			}
		})
	}
	defer func() { afterAttempt = nil }()
	k := NewKeeper(cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); k.Run(ctx, zaptest.NewLogger(t)) }()
	defer func() { cancel(); <-done }()
	// Well under KeepResync: only a re-check after the watch began finds it.
	testkit.EventuallyErr(t, KeepResync/2, "our plugin chained after a rewrite before the watch", func() error {
		file, chain, err := loadedChain(confDir)
		if err != nil {
			return err
		}
		if !slices.Equal(chain, []string{"bridge", PluginType}) {
			return fmt.Errorf("the runtime uses %s with chain %v", file, chain)
		}
		return nil
	})
}
