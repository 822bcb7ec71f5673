package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Addresses of the throwaway topology: the binary's namespace and a peer
// namespace standing for the rest of the network.
const (
	serverIP = "10.231.0.1"
	peerIP   = "10.231.0.2"
)

// endpoint is one path a binary serves with its default flags.
type endpoint struct {
	port int
	path string
	// debug endpoints must answer on loopback and be unreachable from the
	// peer; the others must answer the peer (any status: 503 while not
	// ready still proves the port is open).
	debug bool
}

// TestFailClosedAdminLocalhost runs each daemon (the real binary) with its
// default admin, metrics and readiness flags in a network namespace of its
// own, linked to a peer namespace by a veth pair. From inside, the debug
// endpoints (config dumps, /pods, /logging, pprof) answer on loopback; from
// the peer, over the binary's non-loopback address, they are refused while
// readiness and metrics answer, and the public ports serve no debug path.
// The namespaces make the default ports safe to bind, whatever else runs on
// the machine.
func TestFailClosedAdminLocalhost(t *testing.T) {
	roottest.Require(t)
	bin := testkit.BuildBinaries(t, t.TempDir(), "ztunnel", "ztunnel-cp", "ztunnel-cni")
	mesh := t.TempDir()
	if err := os.WriteFile(filepath.Join(mesh, "mesh.yaml"), []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		args, env []string
		// files are written into {dir} first; beside, when set, runs in
		// the same namespace before the binary, until its log says ready.
		files     map[string]string
		beside    *sideProcess
		endpoints []endpoint
	}{
		{
			// The node proxy against ztunnel-cp (local mode, its default
			// listener 127.0.0.1:15012) with this node's token.
			name:  "ztunnel",
			files: map[string]string{"node-tokens": "n1 n1-secret\n", "istio-token": "n1-secret\n"},
			beside: &sideProcess{bin: "ztunnel-cp", ready: "root certificate written", args: []string{
				"--config-dir", mesh, "--state-dir", "{dir}/cp-state", "--node-tokens", "{dir}/node-tokens",
				"--admin", "", "--metrics-addr", "", "--readiness-addr", ""}},
			env: []string{"NODE_NAME=n1", "INPOD_UDS={dir}/zds.sock", "DNS_PROXY=false", "XDS_ADDRESS=127.0.0.1:15012",
				"XDS_ROOT_CA={dir}/cp-state/root-cert.pem", "CA_ROOT_CA={dir}/cp-state/root-cert.pem", "AUTH_TOKEN={dir}/istio-token"},
			endpoints: []endpoint{
				{15000, "/config_dump", true}, {15000, "/logging", true}, {15000, "/debug/pprof/", true},
				{15020, "/metrics", false}, {15021, daemon.ReadyPath, false},
			},
		},
		{
			name: "ztunnel-cp",
			args: []string{"--config-dir", mesh, "--state-dir", "{dir}/state"},
			endpoints: []endpoint{
				{15014, "/config_dump", true}, {15014, "/logging", true}, {15014, "/debug/pprof/", true},
				{15015, "/metrics", false}, {15016, daemon.ReadyPath, false},
			},
		},
		{
			name: "ztunnel-cni",
			args: []string{"--node-name", "n1", "--local-config", mesh, "--install=false", "--state-dir", "{dir}/state",
				"--zds-socket", "{dir}/zds.sock", "--plugin-socket", "{dir}/plugin.sock"},
			endpoints: []endpoint{
				{8000, "/pods", true}, {8000, "/logging", true}, {8000, "/debug/pprof/", true},
				{8001, daemon.ReadyPath, false},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, peer := netnstest.New(t, "srv"), netnstest.New(t, "peer")
			netnstest.Veth(t, srv, "fc0", []string{serverIP + "/24"}, peer, "fc1", []string{peerIP + "/24"})
			dir := t.TempDir()
			expand := func(list []string) []string {
				out := make([]string, len(list))
				for i, s := range list {
					out[i] = string(bytes.ReplaceAll([]byte(s), []byte("{dir}"), []byte(dir)))
				}
				return out
			}
			for name, data := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if b := tc.beside; b != nil {
				sideLogs := start(t, srv.Name, filepath.Join(bin, b.bin), expand(b.args), nil)
				testkit.Eventually(t, 60*time.Second, b.bin+" ready", func() bool { return strings.Contains(sideLogs(), b.ready) })
			}
			logs := start(t, srv.Name, filepath.Join(bin, tc.name), expand(tc.args), expand(tc.env))
			inside, outside := client(srv), client(peer)
			for _, ep := range tc.endpoints {
				if !ep.debug {
					continue
				}
				url := fmt.Sprintf("http://127.0.0.1:%d%s", ep.port, ep.path)
				testkit.Eventually(t, 60*time.Second, tc.name+" debug server on loopback", func() bool {
					code, _ := get(inside, url)
					return code == http.StatusOK
				})
			}
			for _, ep := range tc.endpoints {
				url := fmt.Sprintf("http://%s:%d%s", serverIP, ep.port, ep.path)
				code, err := get(outside, url)
				switch {
				case ep.debug && !errors.Is(err, syscall.ECONNREFUSED):
					t.Errorf("debug %s from the network: status %d, error %v; want connection refused\n%s", url, code, err, logs())
				case !ep.debug && err != nil:
					t.Errorf("%s from the network: %v; want an answer\n%s", url, err, logs())
				case !ep.debug && code != http.StatusOK && code != http.StatusServiceUnavailable:
					t.Errorf("%s from the network = %d", url, code)
				}
				if ep.debug {
					continue
				}
				// A public port serves its own path only.
				for _, dbg := range []string{"/config_dump", "/pods", "/logging", "/debug/pprof/", "/quitquitquit"} {
					u := fmt.Sprintf("http://%s:%d%s", serverIP, ep.port, dbg)
					if code, err := get(outside, u); err != nil || code != http.StatusNotFound {
						t.Errorf("public %s = %d %v, want 404", u, code, err)
					}
				}
			}
		})
	}
}

// sideProcess is a daemon the binary under test needs beside it.
type sideProcess struct {
	bin   string
	args  []string
	ready string // the log line that says it serves
}

// start runs bin in namespace ns (ip netns exec) with only env and stops it
// (SIGTERM, then SIGKILL) when t ends; it returns what the process printed.
func start(t *testing.T, ns, bin string, args, env []string) func() string {
	t.Helper()
	var mu sync.Mutex
	var out bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// client is an HTTP client whose connections are opened inside ns.
func client(ns *netnstest.NS) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.Do(func() error {
				var err error
				c, err = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

func get(c *http.Client, url string) (int, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}
