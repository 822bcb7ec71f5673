package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	chart := []string{"--in-cluster", "--listen=:15012", "--admin=localhost:15014", "--metrics-addr=:15015",
		"--readiness-addr=:15016", "--system-namespace=mesh", "--lease-namespace=mesh", "--trusted-node-accounts=mesh/ztunnel",
		"--root-cert=/c", "--root-key=/k", "--log-level=debug", "--log-format=json"}
	tests := []struct {
		name    string
		args    []string
		wantErr string // "" means no error
	}{
		{"chart arguments", chart, ""},
		{"local mode", []string{"--config-dir=/d"}, ""},
		{"unknown flag", append(slices.Clone(chart), "--leader-elect=true"), "flag provided but not defined: -leader-elect"},
		{"no mode", []string{"--listen=:1"}, "is required"},
		{"both modes", []string{"--config-dir=/d", "--kubeconfig=/k"}, "exclude each other"},
		{"bad log level", []string{"--config-dir=/d", "--log-level=loud"}, "--log-level"},
		{"bad log format", []string{"--config-dir=/d", "--log-format=xml"}, "--log-format"},
		{"root cert without key", []string{"--config-dir=/d", "--root-cert=/c"}, "go together"},
		{"bad trusted account", []string{"--in-cluster", "--trusted-node-accounts=ztunnel"}, "--trusted-node-accounts"},
		{"bad readiness address", []string{"--in-cluster", "--readiness-addr=15021"}, "--readiness-addr"},
		{"debug server on every address", []string{"--in-cluster", "--admin=:15014"}, "loopback only"},
		{"debug server on the pod IP", []string{"--in-cluster", "--admin=10.244.0.7:15014"}, "loopback only"},
		{"stray argument", []string{"--in-cluster", "extra"}, "unexpected arguments"},
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
	if s.Mode != "kubernetes" || s.RootConfigMap != "mesh/istio-ca-root-cert" || s.RootConfigMapKey != "root-cert.pem" ||
		s.ReadinessAddr != ":15016" || s.ReadinessPath != "/healthz/ready" || s.MetricsAddr != ":15015" ||
		s.Admin != "localhost:15014" || s.Lease != "mesh/ztunnel-cp" || !slices.Equal(s.TrustedNodeAccounts, []string{"mesh/ztunnel"}) {
		t.Errorf("summary = %+v", s)
	}
	if o.EnrollmentFromLabels {
		t.Error("Kubernetes mode enrols from labels without --enrollment-from-labels")
	}
	if !slices.Contains(s.ServingNames, "ztunnel-cp.mesh.svc") {
		t.Errorf("serving names %v lack the Service's ztunnel-cp.mesh.svc", s.ServingNames)
	}
	o, _ = parseFlags([]string{"--kubeconfig=/k", "--listen=10.1.2.3:15012"}, io.Discard)
	if names := o.ServingNames(); !slices.Contains(names, "10.1.2.3") || !slices.Contains(names, "ztunnel-cp.istio-system.svc") {
		t.Errorf("serving names %v lack the listener's IP or the default namespace's Service", names)
	}
	o, _ = parseFlags([]string{"--config-dir=/d"}, io.Discard)
	if o.ServingNames() != nil || !o.EnrollmentFromLabels {
		t.Errorf("local mode: serving names %v (want nil: the control plane's defaults), enrolment from labels %v",
			o.ServingNames(), o.EnrollmentFromLabels)
	}
	if s := o.summary(); s.Admin != "localhost:15014" || s.MetricsAddr != ":15015" || s.ReadinessAddr != ":15016" {
		t.Errorf("defaults: %+v", s)
	}
}
