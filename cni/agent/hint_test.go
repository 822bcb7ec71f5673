package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// The sandbox path the plugin reports for a pod it does not hand over
// (POST /netns) is the hint a later enrollment by relabel gets, also after
// the agent restarts.
func TestSandboxHintSurvivesRestart(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	hints := map[string]string{}
	cfg := e.config()
	cfg.FindNetns = func(_ context.Context, p *corev1.Pod, hint string) (string, *netns.Handle, error) {
		mu.Lock()
		hints[string(p.UID)] = hint
		mu.Unlock()
		return "", nil, ErrNetnsUnproven
	}
	e.src.set(ns("apps", false), pod("apps", "a", "10.0.0.7", true, nil))
	e.start(cfg)
	body, _ := json.Marshal(plugin.AddRequest{Netns: "/var/run/netns/cni-1234", PodName: "a", PodNamespace: "apps", PodUID: "uid-a"})
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", cfg.PluginSocket)
		}}}
	resp, err := client.Post("http://unix"+plugin.PathNetns, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST %s: %s", plugin.PathNetns, resp.Status)
	}
	e.stop()

	e.src.set(ns("apps", true), pod("apps", "a", "10.0.0.7", true, nil))
	e.start(cfg)
	testkit.Eventually(t, waitTimeout, "the relabelled pod's search got the hint", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return hints["uid-a"] == "/var/run/netns/cni-1234"
	})
}
