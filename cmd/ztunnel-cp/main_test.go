package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	chart := []string{"--in-cluster", "--listen=:15012", "--admin=:15014", "--readiness-addr=:15021",
		"--system-namespace=mesh", "--lease-namespace=mesh", "--trusted-node-accounts=mesh/ztunnel",
		"--root-cert=/c", "--root-key=/k", "--log-level=debug"}
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
		{"root cert without key", []string{"--config-dir=/d", "--root-cert=/c"}, "go together"},
		{"bad trusted account", []string{"--in-cluster", "--trusted-node-accounts=ztunnel"}, "--trusted-node-accounts"},
		{"bad readiness address", []string{"--in-cluster", "--readiness-addr=15021"}, "--readiness-addr"},
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
		s.ReadinessAddr != ":15021" || s.ReadinessPath != "/healthz/ready" || s.Lease != "mesh/ztunnel-cp" ||
		!slices.Equal(s.TrustedNodeAccounts, []string{"mesh/ztunnel"}) {
		t.Errorf("summary = %+v", s)
	}
	if !slices.Contains(s.ServingNames, "ztunnel-cp.mesh.svc") {
		t.Errorf("serving names %v lack the Service's ztunnel-cp.mesh.svc", s.ServingNames)
	}
	o, _ = parseFlags([]string{"--kubeconfig=/k", "--listen=10.1.2.3:15012"}, io.Discard)
	if names := o.servingNames(); !slices.Contains(names, "10.1.2.3") || !slices.Contains(names, "ztunnel-cp.istio-system.svc") {
		t.Errorf("serving names %v lack the listener's IP or the default namespace's Service", names)
	}
	if o, _ := parseFlags([]string{"--config-dir=/d"}, io.Discard); o.servingNames() != nil {
		t.Errorf("local mode serving names = %v, want nil (the control plane's defaults)", o.servingNames())
	}
}

func TestReadiness(t *testing.T) {
	synced := make(chan struct{})
	published := false
	h := readinessHandler(readyFunc(synced, func() bool { return published }))
	get := func(path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code
	}
	if got := get(readinessPath); got != http.StatusServiceUnavailable {
		t.Errorf("before the first translation: %d, want 503", got)
	}
	close(synced)
	if got := get(readinessPath); got != http.StatusServiceUnavailable {
		t.Errorf("synced, root not published: %d, want 503", got)
	}
	published = true
	if got := get(readinessPath); got != http.StatusOK {
		t.Errorf("synced and published: %d, want 200", got)
	}
	if got := get("/ready"); got != http.StatusNotFound {
		t.Errorf("other path: %d, want 404", got)
	}
}
