package main

import (
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testpki"
)

// testRoot writes a self-signed root to dir/root-cert.pem and returns a
// PEM CRL it signs revoking serial.
func testRoot(t *testing.T, dir string, serial int64) (rootPath string, crlPEM []byte) {
	t.Helper()
	root := testpki.NewRoot(t, "mesh root")
	rootPath = filepath.Join(dir, "root-cert.pem")
	if err := os.WriteFile(rootPath, root.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	return rootPath, root.CRL(t, big.NewInt(serial))
}

func TestNewRevocation(t *testing.T) {
	dir := t.TempDir()
	rootPath, crlPEM := testRoot(t, dir, 42)
	crlPath := filepath.Join(dir, "crl.pem")
	if err := os.WriteFile(crlPath, crlPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	log := zap.NewNop()

	if m, err := newRevocation(&config.Config{CARootCA: rootPath}, log, nil); m != nil || err != nil {
		t.Fatalf("CRL_PATH unset: %v, %v; want no manager", m, err)
	}
	if revocationOf(nil) != nil || crlDump(nil) != nil {
		t.Fatal("no manager must be a nil hbone.Revocation and no dump section")
	}
	m, err := newRevocation(&config.Config{CRLPath: crlPath, CARootCA: rootPath}, log, prometheus.NewRegistry())
	if err != nil || m == nil || m.Set().Len() != 1 {
		t.Fatalf("CRL_PATH set: %v, %v", m, err)
	}
	if revocationOf(m) == nil || crlDump(m) == nil {
		t.Fatal("a manager must be wired")
	}
	// Inline PEM roots verify as a file does.
	rootPEM, _ := os.ReadFile(rootPath)
	if _, err := newRevocation(&config.Config{CRLPath: crlPath, CARootCA: string(rootPEM)}, log, nil); err != nil {
		t.Fatalf("inline CA_ROOT_CA: %v", err)
	}
	for name, tc := range map[string]struct {
		cfg  config.Config
		want string
	}{
		"system roots":  {config.Config{CRLPath: crlPath, CARootCA: config.RootSystem}, "CA_ROOT_CA is SYSTEM"},
		"another root":  {config.Config{CRLPath: crlPath, CARootCA: func() string { p, _ := testRoot(t, t.TempDir(), 1); return p }()}, "not signed by the mesh trust root of that name"},
		"missing file":  {config.Config{CRLPath: filepath.Join(dir, "none.pem"), CARootCA: rootPath}, "no such file"},
		"missing roots": {config.Config{CRLPath: crlPath, CARootCA: filepath.Join(dir, "none.pem")}, "mesh trust roots (CA_ROOT_CA)"},
	} {
		_, err := newRevocation(&tc.cfg, log, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "CRL_PATH: ") {
			t.Errorf("%s: %v, want an error starting CRL_PATH: and containing %q", name, err, tc.want)
		}
	}
}
