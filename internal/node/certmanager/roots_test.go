package certmanager

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ztunnel-go/ztunnel-go/internal/api/caapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// serveCA serves a test CA with cert on addr until stop is called.
func serveCA(t *testing.T, addr string, cert tls.Certificate) (string, func()) {
	t.Helper()
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var lis net.Listener
	for range 100 { // re-listening on a just-closed port can race the kernel
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	caapi.RegisterIstioCertificateServiceServer(srv, &testCAServer{ca: authority, wantToken: "tok"})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), srv.Stop
}

func writePEM(t *testing.T, path string, c tls.Certificate) {
	t.Helper()
	raw := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
	writeAtomically(t, path, raw)
}

// writeAtomically replaces path as a ConfigMap update does (new file, rename).
func writeAtomically(t *testing.T, path string, raw []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestFailClosedRootReload rotates CA_ROOT_CA under a running requester: a
// garbage file is refused with an error log and the old roots stay in
// force; after the rotation a CA presenting a certificate from the new root
// is accepted, and one from the old root is not. (Issue 12 item 11; on
// 325f4ba the roots were read once, so the rotated CA was never trusted.)
func TestFailClosedRootReload(t *testing.T) {
	oldCert, oldPool := servingCert(t)
	newCert, _ := servingCert(t)
	path := filepath.Join(t.TempDir(), "root-cert.pem")
	writePEM(t, path, oldCert)

	core, logs := observer.New(zapcore.InfoLevel)
	roots, err := LoadRootFile(path, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- roots.Run(ctx, 10*time.Millisecond) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	addr, stopOld := serveCA(t, "127.0.0.1:0", oldCert)
	req, err := NewGRPCRequester(GRPCConfig{Address: addr, Roots: roots.Pool, Token: StaticToken("tok"), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = req.Close() })
	key, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := identity.NewCSR(idA, key)
	if err != nil {
		t.Fatal(err)
	}
	request := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := req.Request(ctx, idA, csr)
		return err
	}
	if err := request(); err != nil {
		t.Fatalf("request to the CA of the loaded root: %v", err)
	}

	// A garbage file: refused, logged, the old roots keep serving.
	writeAtomically(t, path, []byte("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n"))
	testkit.Eventually(t, 5*time.Second, "the parse failure logged", func() bool {
		return logs.FilterMessageSnippet("do not parse").Len() == 1
	})
	if !roots.Pool().Equal(oldPool) {
		t.Fatal("a garbage root file replaced the roots in force")
	}
	if err := request(); err != nil {
		t.Fatalf("request after a garbage root file: %v", err)
	}

	// The CA rotates to a certificate from a new root before the file does:
	// not trusted yet.
	stopOld()
	serveCA(t, addr, newCert)
	if err := request(); err == nil {
		t.Fatal("a CA certificate from a root not yet in the file was accepted")
	}
	writePEM(t, path, newCert)
	testkit.Eventually(t, 5*time.Second, "the reload logged", func() bool {
		return logs.FilterMessage("root certificates reloaded").Len() == 1
	})
	testkit.Eventually(t, 5*time.Second, "the rotated CA accepted", func() bool { return request() == nil })
	if roots.Pool().Equal(oldPool) {
		t.Fatal("roots in force are still the old ones")
	}
	if n := logs.FilterMessageSnippet("do not parse").Len(); n != 1 {
		t.Errorf("parse failure logged %d times, want once", n)
	}
}

func TestParseRoots(t *testing.T) {
	c, _ := servingCert(t)
	good := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
	tests := []struct {
		name string
		raw  []byte
		want int // 0: refused
	}{
		{"one certificate", good, 1},
		{"two, with a key block between", append(append(append([]byte{}, good...), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{1}})...), good...), 2},
		{"empty", nil, 0},
		{"not PEM", []byte("hello"), 0},
		{"one good, one corrupt", append(append([]byte{}, good...), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}})...), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, n, err := ParseRoots(tt.raw)
			if tt.want == 0 {
				if err == nil {
					t.Fatalf("accepted (%d certificates)", n)
				}
				return
			}
			if err != nil || n != tt.want {
				t.Fatalf("ParseRoots = %d, %v; want %d", n, err, tt.want)
			}
		})
	}
}
