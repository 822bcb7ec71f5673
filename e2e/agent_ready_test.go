package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/cni/agent/bootstrap"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// TestAgentNotReadyWithoutPlugin runs the node agent binary as the chart
// does (--install) with a CNI conf dir that is not the node's (an empty
// directory: no network to chain into). It serves pods, yet its readiness
// (/healthz/ready, what the kubelet probes) answers 503 naming the plugin,
// attempt after attempt, and nothing is chained into the node's conflist.
// The same agent told the node's conf dir turns Ready, the plugin chained.
func TestAgentNotReadyWithoutPlugin(t *testing.T) {
	installDir := t.TempDir()
	c := newCaptureCluster(t, installDir)
	n := c.node
	const readyAddr = "127.0.0.1:15021"
	ready := func() (int, string) {
		t.Helper()
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return n.Dial(ctx, "tcp", readyAddr) }}}
		resp, err := client.Get("http://agent/healthz/ready")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	start := func(confDir string) *testcluster.Proc {
		t.Helper()
		p, err := n.Start(testcluster.Process{Name: "ztunnel-cni-agent", Path: filepath.Join(ztunnelCNI(t), "ztunnel-cni"),
			Args: agentArgs(c, "--install", "--cni-bin-dir", installDir, "--cni-conf-dir", confDir, "--keep-on-exit=false",
				"--readiness-addr", readyAddr)})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WaitLog(ctxT(t, 20*time.Second), "node agent ready"); err != nil {
			t.Fatal(err)
		}
		return p
	}

	wrong := t.TempDir()
	p := start(wrong)
	// Two failed install attempts (one a second), then readiness, a few times.
	if err := p.WaitLog(ctxT(t, 20*time.Second), "installing the CNI plugin failed"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		code, body := ready()
		if code != http.StatusServiceUnavailable || !strings.Contains(body, bootstrap.TaskPlugin) {
			t.Fatalf("GET /healthz/ready (check %d) with --cni-conf-dir %s = %d %q, want 503 naming %q", i, wrong, code, body, bootstrap.TaskPlugin)
		}
		time.Sleep(time.Second)
	}
	if !strings.Contains(string(p.Log()), wrong) {
		t.Errorf("the agent's log does not name the directory it could not install into (%s)", wrong)
	}
	if chained(t, n) {
		t.Error("the node's conflist chains the plugin although the agent was told another directory")
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}

	p = start(n.CNIConfDir)
	defer p.Stop()
	if err := p.WaitLog(ctxT(t, 20*time.Second), "CNI plugin installed"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := ready()
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /healthz/ready with the node's conf dir = %d %q, want 200", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !chained(t, n) {
		t.Error("Ready, but the node's conflist does not chain the plugin")
	}
}

// chained: the node's conflist has the plugin's entry.
func chained(t *testing.T, n *testcluster.Node) bool {
	t.Helper()
	b, err := os.ReadFile(n.ConfList)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), `"ztunnel-cni"`)
}
