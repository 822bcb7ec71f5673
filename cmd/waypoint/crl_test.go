package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestWaypointCRLPath: --crl-path loads CRLs signed by the --root-cert
// root; one the waypoint cannot load (missing, signed by another key of the root's name, no
// roots) stops it with an error naming the flag, never a waypoint without
// the checks it was told to make.
func TestWaypointCRLPath(t *testing.T) {
	dir := t.TempDir()
	mkRoot := func(name, file string) (string, *x509.Certificate, *ecdsa.PrivateKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		p := filepath.Join(dir, file)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			t.Fatal(err)
		}
		return p, c, key
	}
	rootPath, root, key := mkRoot("mesh-root", "root.pem")
	// The mesh root's name with another key: its CRL cannot verify.
	otherPath, _, _ := mkRoot("mesh-root", "impostor.pem")
	b, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(1), ThisUpdate: time.Now(),
		NextUpdate: time.Now().Add(time.Hour), RevokedCertificateEntries: []x509.RevocationListEntry{{SerialNumber: big.NewInt(7), RevocationTime: time.Now()}}}, root, key)
	if err != nil {
		t.Fatal(err)
	}
	crlPath := filepath.Join(dir, "ca-crl.pem")
	if err := os.WriteFile(crlPath, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: b}), 0o644); err != nil {
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
