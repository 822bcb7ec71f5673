package main

import (
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testpki"
)

// TestWaypointCRLPath: --crl-path loads CRLs signed by the --root-cert
// root; one the waypoint cannot load (missing, signed by another key of the root's name, no
// roots) stops it with an error naming the flag, never a waypoint without
// the checks it was told to make.
func TestWaypointCRLPath(t *testing.T) {
	dir := t.TempDir()
	mkRoot := func(name, file string) (string, *testpki.CA) {
		ca := testpki.NewRoot(t, name)
		p := filepath.Join(dir, file)
		if err := os.WriteFile(p, ca.CertPEM(), 0o644); err != nil {
			t.Fatal(err)
		}
		return p, ca
	}
	rootPath, root := mkRoot("mesh-root", "root.pem")
	// The mesh root's name with another key: its CRL cannot verify.
	otherPath, _ := mkRoot("mesh-root", "impostor.pem")
	crlPath := filepath.Join(dir, "ca-crl.pem")
	if err := os.WriteFile(crlPath, root.CRL(t, big.NewInt(7)), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, err := newRevocation(&options{RootCert: rootPath}, zap.NewNop(), nil); m != nil || err != nil || revocationOf(m) != nil {
		t.Fatalf("no --crl-path: %v, %v; want no checks", m, err)
	}
	m, err := newRevocation(&options{RootCert: rootPath, CRLPath: crlPath}, zap.NewNop(), nil)
	if err != nil || m == nil || m.Set().Len() != 1 || revocationOf(m) == nil {
		t.Fatalf("--crl-path: %v, %v; want one revoked serial in force", m, err)
	}
	for name, o := range map[string]options{
		"missing CRL file": {RootCert: rootPath, CRLPath: filepath.Join(dir, "none.pem")},
		"impostor root":    {RootCert: otherPath, CRLPath: crlPath},
		"no roots":         {RootCert: filepath.Join(dir, "none.pem"), CRLPath: crlPath},
	} {
		if _, err := newRevocation(&o, zap.NewNop(), nil); err == nil || !strings.HasPrefix(err.Error(), "--crl-path: ") {
			t.Errorf("%s: %v, want an error naming --crl-path", name, err)
		}
	}
	t.Setenv("CRL_PATH", crlPath)
	t.Setenv("INSTANCE_IP", "10.0.0.1")
	o, err := parseFlags([]string{"--gateway", "demo/waypoint", "--node-name", "n1"})
	if err != nil || o.CRLPath != crlPath {
		t.Fatalf("CRL_PATH env: %q, %v", o.CRLPath, err)
	}
}
