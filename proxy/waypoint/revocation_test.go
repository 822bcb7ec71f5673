package waypoint

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/crl"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestWaypointRevocation: with CRLs (CRL_PATH in cmd/waypoint) the
// waypoint refuses a client whose certificate a CRL revokes, closes that
// client's open tunnel when a reload revokes it, keeps serving everyone
// else, and refuses an upstream whose certificate is revoked (503). Without
// this a revoked workload could still reach any service behind a waypoint:
// the destination's node proxy sees only the waypoint's certificate.
func TestWaypointRevocation(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{Organization: []string{"cluster.local"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(der)
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	crlPath := filepath.Join(dir, "ca-crl.pem")
	number := int64(0)
	writeCRL := func(revoked ...*big.Int) {
		t.Helper()
		number++
		rl := &x509.RevocationList{Number: big.NewInt(number), ThisUpdate: time.Now().Add(-time.Minute), NextUpdate: time.Now().Add(time.Hour)}
		for _, s := range revoked {
			rl.RevokedCertificateEntries = append(rl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now()})
		}
		b, err := x509.CreateRevocationList(rand.Reader, rl, root, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(crlPath, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: b}), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCRL()
	m, err := crl.New(crl.Config{Path: crlPath}, crl.Deps{Roots: func() ([]*x509.Certificate, error) { return []*x509.Certificate{root}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	l := newLabWith(t, baseConfig(), labOptions{
		ca: ca.Options{
			RootCertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			RootKeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		},
		revocation: m,
	})
	serial := func(id identity.Identity) *big.Int {
		wc, err := l.certs.Fetch(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return wc.Leaf.SerialNumber
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c, c2 := l.client(clientID, clientIP), l.client(client2ID, client2IP)
	if code, _ := get(t, c, "/ok"); code != 200 {
		t.Fatalf("before any revocation: GET /ok = %d, want 200", code)
	}
	open, err := l.tunnel(ctx, clientID, clientIP, svcVIP+":9000")
	if err != nil {
		t.Fatalf("tunnel before revocation: %v", err)
	}
	defer open.Close()
	if _, err := open.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(open, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the waypoint: %q, %v", buf, err)
	}

	// Revoke the client: its open tunnel is closed, a new one refused.
	writeCRL(serial(clientID))
	if changed, err := m.Reload(); err != nil || !changed {
		t.Fatalf("reload: changed=%v err=%v", changed, err)
	}
	_ = open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := open.Read(buf); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the revoked client's open tunnel was not closed: read %d bytes, %v", n, err)
	}
	if conn, err := l.tunnel(ctx, clientID, clientIP, svcVIP+":9000"); err == nil {
		conn.Close()
		t.Fatal("a revoked client opened a new tunnel through the waypoint")
	}
	if code, _ := get(t, c2, "/ok"); code != 200 {
		t.Errorf("another client after the revocation: GET /ok = %d, want 200", code)
	}

	// Revoke the backend (its HBONE server's certificate): the waypoint
	// refuses it as an upstream.
	v1ID := identity.MustNew("cluster.local", "demo", "sa-v1")
	writeCRL(serial(clientID), serial(v1ID))
	if _, err := m.Reload(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "GET /ok through a revoked upstream answers 503", func() bool {
		code, _ := get(t, c2, "/ok")
		return code == 503
	})
}
