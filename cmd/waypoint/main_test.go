package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--gateway", "demo/wp", "--ip", "10.0.0.7", "--node-name", "n1", "--xds-address", "cp:15012"})
	if err != nil {
		t.Fatal(err)
	}
	if o.ServiceAccount != "wp" || o.PodName != "waypoint-wp" || o.CAAddress != "cp:15012" || o.Listen != ":15008" {
		t.Errorf("defaults: %+v", o)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ip", "10.0.0.7", "--node-name", "n"}, "--gateway"},
		{[]string{"--gateway", "demo/wp", "--ip", "x", "--node-name", "n"}, "--ip"},
		{[]string{"--gateway", "demo/wp", "--ip", "10.0.0.7"}, "--node-name"},
		{[]string{"--gateway", "demo/wp", "--ip", "10.0.0.7", "--node-name", "n", "--admin-addr", "0.0.0.0:15000"}, "--admin-addr"},
	} {
		if _, err := parseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%v) = %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}

// TestCertificateWaitWhileCADown: while the CA refuses, the waypoint logs
// about its certificate once per backoff step, not once per attempt. It
// used to retry in a tight loop, half a million warnings a second.
func TestCertificateWaitWhileCADown(t *testing.T) {
	dir := t.TempDir()
	rootPath := filepath.Join(dir, "root.pem")
	root, _ := newRoot(t)
	if err := os.WriteFile(rootPath, root, 0o644); err != nil {
		t.Fatal(err)
	}
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := dead.Addr().String()
	dead.Close() // nothing listens there: the CA and xDS are down
	o, err := parseFlags([]string{"--gateway", "demo/wp", "--ip", "127.0.0.1", "--node-name", "n1",
		"--xds-address", addr, "--root-cert", rootPath, "--token", "t", "--listen", "127.0.0.1:0",
		"--metrics-addr", "", "--readiness-addr", "", "--admin-addr", "", "--drain-duration", "100ms",
		"--adaptive-procs=false"}) // GOMAXPROCS is the test binary's
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(core)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		lc, _ := o.log.Config()
		done <- run(ctx, o, lc, log, zap.NewAtomicLevel())
	}()
	const window = 2 * time.Second
	time.Sleep(window)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop")
	}
	var lines []string
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "certificate") {
			lines = append(lines, e.Message)
		}
	}
	t.Logf("%d certificate log lines in %v: %q", len(lines), window, lines)
	// The default backoff (100 ms doubling) has five steps in 2 s; the
	// certificate manager adds the first failure's line.
	if len(lines) < 2 || len(lines) > 8 {
		t.Fatalf("%d certificate log lines in %v with the CA down, want one per backoff step (2..8):\n%s",
			len(lines), window, strings.Join(lines[:min(len(lines), 20)], "\n"))
	}
}

// TestParseFlagsEastWest: --mode east-west (env GATEWAY_MODE) with its
// --network; an unknown mode is refused by name.
func TestParseFlagsEastWest(t *testing.T) {
	o, err := parseFlags([]string{"--gateway", "istio-system/istio-eastwestgateway", "--ip", "10.0.0.7", "--node-name", "n1",
		"--mode", "east-west", "--network", "network1"})
	if err != nil {
		t.Fatal(err)
	}
	if o.Mode != modeEastWest || o.Network != "network1" || o.PodName != "east-west-istio-eastwestgateway" ||
		o.ServiceAccount != "istio-eastwestgateway" {
		t.Errorf("options %+v", o)
	}
	if _, err := parseFlags([]string{"--gateway", "demo/wp", "--ip", "10.0.0.7", "--node-name", "n", "--mode", "ingress"}); err == nil ||
		!strings.Contains(err.Error(), "--mode") {
		t.Errorf("unknown mode: err = %v, want one naming --mode", err)
	}
}

// TestRunEastWest: in east-west mode the binary builds the gateway on the
// shared xDS, certificate and admin wiring, serves its listener and stops
// cleanly, with the control plane unreachable.
func TestRunEastWest(t *testing.T) {
	dir := t.TempDir()
	rootPath := filepath.Join(dir, "root.pem")
	root, _ := newRoot(t)
	if err := os.WriteFile(rootPath, root, 0o644); err != nil {
		t.Fatal(err)
	}
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := dead.Addr().String()
	dead.Close()
	o, err := parseFlags([]string{"--gateway", "istio-system/ew", "--ip", "127.0.0.1", "--node-name", "n1", "--mode", "east-west",
		"--network", "west", "--xds-address", addr, "--root-cert", rootPath, "--token", "t", "--listen", "127.0.0.1:0",
		"--metrics-addr", "", "--readiness-addr", "", "--admin-addr", "", "--drain-duration", "100ms"})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	want := runtime.GOMAXPROCS(0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		lc, _ := o.log.Config()
		done <- run(ctx, o, lc, zap.New(core), zap.NewAtomicLevel())
	}()
	deadline := time.Now().Add(10 * time.Second)
	for logs.FilterMessage("east-west serving").Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop")
	}
	lines := logs.FilterMessage("east-west serving").All()
	if len(lines) != 1 || lines[0].ContextMap()["network"] != "west" {
		t.Fatalf("serving lines %+v, want one naming network west", lines)
	}
	// Adaptive GOMAXPROCS is on by default: its task ran (on a machine
	// with more than one CPU) and gave the P count back when run stopped.
	if runtime.GOMAXPROCS(0) != want {
		t.Errorf("GOMAXPROCS %d after run, want %d back", runtime.GOMAXPROCS(0), want)
	}
	if want > 1 && logs.FilterMessage("GOMAXPROCS follows the load").Len() != 1 {
		t.Error("no adaptive GOMAXPROCS task in run")
	}
}

// TestParseFlagsAdaptiveProcs: on by default, off by flag or
// ADAPTIVE_PROCS, and off when GOMAXPROCS is set (the operator chose).
func TestParseFlagsAdaptiveProcs(t *testing.T) {
	base := []string{"--gateway", "demo/wp", "--ip", "10.0.0.7", "--node-name", "n1"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want bool
	}{
		{"default", nil, nil, true},
		{"flag off", nil, []string{"--adaptive-procs=false"}, false},
		{"env off", map[string]string{"ADAPTIVE_PROCS": "false"}, nil, false},
		{"GOMAXPROCS set", map[string]string{"GOMAXPROCS": "2"}, nil, false},
		{"GOMAXPROCS beats the flag", map[string]string{"GOMAXPROCS": "2"}, []string{"--adaptive-procs"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", "")
			t.Setenv("ADAPTIVE_PROCS", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			o, err := parseFlags(append(append([]string{}, base...), tc.args...))
			if err != nil {
				t.Fatal(err)
			}
			if o.AdaptiveProcs != tc.want {
				t.Fatalf("AdaptiveProcs %v, want %v", o.AdaptiveProcs, tc.want)
			}
		})
	}
}
