package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/bootstrap"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

func TestWantedIdentities(t *testing.T) {
	s := state.NewStore()
	proxytest.Apply(t, s,
		proxytest.Pod("ns1", "a", "10.0.0.1"),
		proxytest.Pod("ns1", "a2", "10.0.0.2", proxytest.ServiceAccount("sa-a")), // same identity as a
		proxytest.Pod("ns1", "b", "10.0.0.3"),
		proxytest.Pod("ns1", "plain", "10.0.0.4", proxytest.Plaintext()),         // not HBONE: no certificate
		proxytest.Pod("ns2", "elsewhere", "10.0.1.1", proxytest.OnNode("node1")), // another node
	)
	got := wantedIdentities(s.Load(), "node0")
	want := []identity.Identity{
		identity.MustNew("cluster.local", "ns1", "sa-a"),
		identity.MustNew("cluster.local", "ns1", "sa-b"),
	}
	if !slices.Equal(got, want) {
		t.Errorf("wanted = %v, want %v", got, want)
	}
	if got := wantedIdentities(s.Load(), "node9"); len(got) != 0 {
		t.Errorf("empty node: %v", got)
	}
}

func TestWatchWantedFollowsState(t *testing.T) {
	s := state.NewStore()
	calls := make(chan []identity.Identity, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { watchWanted(ctx, s, "node0", func(ids []identity.Identity) { calls <- ids }); close(done) }()
	if ids := <-calls; len(ids) != 0 {
		t.Errorf("initial wanted = %v", ids)
	}
	proxytest.Apply(t, s, proxytest.Pod("ns1", "a", "10.0.0.1"))
	if ids := <-calls; len(ids) != 1 || ids[0].ServiceAccount != "sa-a" {
		t.Errorf("after a pod arrived: %v", ids)
	}
	cancel()
	<-done
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The whole node proxy in-process against ztunnel-cp's local mode (the
// same bootstrap.Run, in-process too, as the harnesses run beside it): xDS
// and the CA over loopback TLS with this node's token from AUTH_TOKEN and
// the root from the control plane's state directory, the state syncs,
// certificates for this node's HBONE workloads are fetched, readiness waits
// only for the (absent) node agent, and /quitquitquit stops it cleanly.
func TestRunAgainstLocalControlPlane(t *testing.T) {
	dir := t.TempDir()
	yaml := `apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: demo, labels: {app: client}}
spec: {nodeName: node0, serviceAccountName: client, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIP: 10.0.0.10, podIPs: [{ip: 10.0.0.10}]}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: demo, labels: {app: server}}
spec: {nodeName: node1, serviceAccountName: server, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIP: 10.0.1.10, podIPs: [{ip: 10.0.1.10}]}
`
	meshDir, stateDir := filepath.Join(dir, "mesh"), filepath.Join(dir, "cp-state")
	tokens, token := filepath.Join(dir, "node-tokens"), filepath.Join(dir, "istio-token")
	for path, data := range map[string]string{filepath.Join(meshDir, "mesh.yaml"): yaml,
		tokens: "node0 node0-secret\n", token: "node0-secret\n"} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cpAddr := freePort(t)
	cpCtx, stopCP := context.WithCancel(context.Background())
	cpDone := make(chan error, 1)
	go func() {
		cpDone <- bootstrap.Run(cpCtx, bootstrap.Options{
			ConfigDir: meshDir, Listen: cpAddr, StateDir: stateDir, NodeTokens: tokens,
			TrustDomain: translate.DefaultTrustDomain, ClusterID: translate.DefaultClusterID,
			RootNamespace: translate.DefaultRootNamespace, EnrollmentFromLabels: true,
		}, zaptest.NewLogger(t).Named("cp"), zap.NewAtomicLevel())
	}()
	t.Cleanup(func() {
		stopCP()
		if err := <-cpDone; err != nil {
			t.Errorf("control plane: %v", err)
		}
	})
	// It writes root-cert.pem before it listens.
	testkit.Eventually(t, 30*time.Second, "control plane listening", func() bool {
		c, err := net.Dial("tcp", cpAddr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	adminAddr, readyAddr := freePort(t), freePort(t)
	root := filepath.Join(stateDir, "root-cert.pem")
	env := map[string]string{
		config.EnvNodeName: "node0", config.EnvInpodUDS: filepath.Join(dir, "no-agent.sock"),
		config.EnvXDSAddress: cpAddr, config.EnvXDSRootCA: root, config.EnvCARootCA: root, config.EnvAuthToken: token,
		config.EnvAdminAddr: adminAddr, config.EnvStatsAddr: freePort(t), config.EnvReadinessAddr: readyAddr,
		config.EnvDNSProxy: "false",
	}
	cfg, err := config.Parse(func(k string) (string, bool) { v, ok := env[k]; return v, ok }, nil)
	if err != nil {
		t.Fatal(err)
	}
	level := zap.NewAtomicLevelAt(zap.InfoLevel)
	done := make(chan error, 1)
	go func() { done <- run(context.Background(), cfg, zaptest.NewLogger(t, zaptest.Level(level)), level) }()

	get := func(addr, path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Poll until the state is synced and the certificate fetched (a hang
	// guard bounds it, not a timing assertion).
	var dump struct {
		Generation   uint64                  `json:"generation"`
		Workloads    []struct{ Name string } `json:"workloads"`
		Certificates []struct{ Identity, State string }
		Retries      []backoff.Status `json:"retries"`
	}
	testkit.EventuallyErr(t, 30*time.Second, "the node proxy synced", func() error {
		code, body := get(readyAddr, "/healthz/ready")
		// The first line says what is pending; the lines below list the
		// failing retry loops: here ZDS, as no node agent runs.
		first, rest, _ := strings.Cut(body, "\n")
		ready := code == 503 && first == "not ready, pending: workload proxy manager" &&
			strings.HasPrefix(rest, "retrying:\n  zds: ")
		_, raw := get(adminAddr, "/config_dump")
		_ = json.Unmarshal([]byte(raw), &dump)
		if ready && len(dump.Certificates) == 1 && dump.Certificates[0].State == "Available" && len(dump.Retries) == 2 &&
			dump.Retries[0].Name == "xds" && !dump.Retries[0].Failing && dump.Retries[1].Name == "zds" && dump.Retries[1].Failing {
			return nil
		}
		return fmt.Errorf("readiness %d %q; dump %s", code, body, raw)
	})
	if dump.Generation == 0 || len(dump.Workloads) != 2 {
		t.Errorf("dump: generation %d, %d workloads", dump.Generation, len(dump.Workloads))
	}
	if got := dump.Certificates[0].Identity; got != "spiffe://cluster.local/ns/demo/sa/client" {
		t.Errorf("certificate for %s, want only node0's client", got)
	}
	resp, err := http.Post("http://"+adminAddr+"/quitquitquit", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run = %v, want nil after /quitquitquit", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after /quitquitquit")
	}
	if code, body := get(adminAddr, "/"); code != 0 || !strings.Contains(body, "refused") {
		t.Errorf("admin still serving after shutdown: %d %s", code, fmt.Sprint(body))
	}
}

func TestParseConfigLogFlagsWinOverEnvironment(t *testing.T) {
	env := map[string]string{config.EnvNodeName: "n1", config.EnvRustLog: "warn", config.EnvLogFormat: "plain"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, tc := range []struct {
		args          []string
		level, format string
		wantErr       string
	}{
		{nil, "warn", "console", ""}, // XDS_ADDRESS defaults to istiod
		{[]string{"--log-level=debug"}, "debug", "console", ""},
		{[]string{"--log-format=json"}, "warn", "json", ""},
		{[]string{"--log-level=loud"}, "", "", "--log-level"},
		{[]string{"stray"}, "", "", "unexpected arguments"},
		// The removed local mode names its replacement.
		{[]string{"--local-config=/d"}, "", "", "ztunnel-cp --config-dir /d"},
	} {
		cfg, err := parseConfig(tc.args, lookup, nil, io.Discard)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err = %v, want %q", tc.args, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case cfg.LogLevel.String() != tc.level || cfg.LogFormat != tc.format:
			t.Errorf("%q: level %s format %s, want %s %s", tc.args, cfg.LogLevel, cfg.LogFormat, tc.level, tc.format)
		}
	}
}
