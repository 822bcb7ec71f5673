package main

import (
	"io"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	chart := []string{"--node-name=n1", "--in-cluster", "--system-namespace=mesh", "--state-dir=/var/run/ztunnel-cni",
		"--install=true", "--keep-on-exit=true", "--dns-capture=true", "--exclude-namespaces=kube-system",
		"--admin-addr=localhost:8000", "--readiness-addr=:8001", "--log-level=warn", "--log-format=json"}
	tests := []struct {
		name    string
		args    []string
		wantErr string // "" means no error
	}{
		{"chart arguments", chart, ""},
		{"local mode", []string{"--node-name=n1", "--local-config=/d"}, ""},
		{"unknown flag", append(append([]string{}, chart...), "--leader-elect"), "flag provided but not defined: -leader-elect"},
		{"no node", []string{"--in-cluster"}, "--node-name is required"},
		{"no mode", []string{"--node-name=n1"}, "is required"},
		{"both modes", []string{"--node-name=n1", "--local-config=/d", "--in-cluster"}, "exclude each other"},
		{"plugin kubeconfig without in-cluster", []string{"--node-name=n1", "--kubeconfig=/k", "--plugin-kubeconfig=/p"}, "goes with --in-cluster"},
		{"bad log level", []string{"--node-name=n1", "--in-cluster", "--log-level=loud"}, "--log-level"},
		{"bad log format", []string{"--node-name=n1", "--in-cluster", "--log-format=xml"}, "--log-format"},
		{"unresolved admin address", []string{"--node-name=n1", "--in-cluster", "--admin-addr=$(HOST_IP)"}, "--admin-addr"},
		{"admin on the host IP", []string{"--node-name=n1", "--in-cluster", "--admin-addr=10.0.0.1:8000"}, "loopback only"},
		{"admin on every address", []string{"--node-name=n1", "--in-cluster", "--admin-addr=:8000"}, "loopback only"},
		{"bad readiness address", []string{"--node-name=n1", "--in-cluster", "--readiness-addr=8001"}, "--readiness-addr"},
		{"stray argument", []string{"--node-name=n1", "--in-cluster", "x"}, "unexpected arguments"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args, io.Discard)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("parseFlags: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("parseFlags: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	o, err := parseFlags(chart, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s := o.summary()
	if s.Mode != "kubernetes" || s.AdminAddr != "localhost:8000" || s.ReadinessAddr != ":8001" || s.ReadinessPath != "/healthz/ready" ||
		s.PluginKubeconfig != "/var/run/ztunnel-cni/plugin-kubeconfig" || s.NodeName != "n1" || o.LogLevel != "warn" {
		t.Errorf("summary = %+v (plugin log level %q)", s, o.LogLevel)
	}
	o, _ = parseFlags([]string{"--node-name=n1", "--local-config=/d"}, io.Discard)
	if s := o.summary(); s.AdminAddr != "localhost:8000" || s.ReadinessAddr != ":8001" {
		t.Errorf("defaults: %+v", s)
	}
}
