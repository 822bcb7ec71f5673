package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// newRoot returns a fresh CA root certificate as PEM and as a pool.
func newRoot(t *testing.T) ([]byte, *x509.CertPool) {
	t.Helper()
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(authority.Root())
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: authority.Root().Raw}), pool
}

// replaceFile swaps path's content as a ConfigMap update does (write, rename).
func replaceFile(t *testing.T, path string, raw []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// TestUpstreamRootsFollowTheFile: the xDS and CA configurations the waypoint
// builds carry a Roots function (no fixed RootCAs) that reflects a rewritten
// --root-cert once the watcher has run, and keeps the previous roots when
// the rewrite does not parse.
func TestUpstreamRootsFollowTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "root-cert.pem")
	pemA, poolA := newRoot(t)
	pemB, poolB := newRoot(t)
	replaceFile(t, path, pemA)

	o, err := parseFlags([]string{"--gateway", "demo/wp", "--ip", "10.0.0.7", "--node-name", "n1",
		"--xds-address", "cp:15012", "--root-cert", path, "--token", "tok"})
	if err != nil {
		t.Fatal(err)
	}
	u, err := newUpstream(o, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if u.xds.RootCAs != nil || u.ca.RootCAs != nil {
		t.Fatal("a fixed RootCAs pool is set; want only the reloading Roots")
	}
	if u.xds.Roots == nil || u.ca.Roots == nil {
		t.Fatal("xDS or CA config has no Roots function: roots would be read once")
	}
	if u.xds.Address != "cp:15012" || u.ca.Address != "cp:15012" || u.xds.Token != "tok" || u.xds.TokenFile != "" {
		t.Errorf("addresses/token: xds %q %q %q, ca %q", u.xds.Address, u.xds.Token, u.xds.TokenFile, u.ca.Address)
	}
	if !u.xds.Roots().Equal(poolA) || !u.ca.Roots().Equal(poolA) {
		t.Fatal("initial roots are not the file's")
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { u.watch(ctx, 10*time.Millisecond) })
	defer func() { cancel(); wg.Wait() }()

	replaceFile(t, path, pemB)
	testkit.Eventually(t, 5*time.Second, "xDS and CA roots follow the rewritten file", func() bool {
		return u.xds.Roots().Equal(poolB) && u.ca.Roots().Equal(poolB)
	})

	// Stop the watcher first: a file's content is parsed once, so if the
	// watcher read the broken bundle first, this Reload would see it as
	// already refused and report nothing.
	cancel()
	wg.Wait()
	replaceFile(t, path, []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"))
	if _, err := u.roots.Reload(); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Reload of a broken bundle = %v, want a refusal naming the file", err)
	}
	if !u.xds.Roots().Equal(poolB) || !u.ca.Roots().Equal(poolB) {
		t.Fatal("a broken rewrite replaced the roots; want the previous ones kept")
	}
}

// TestUpstreamRefusesUnreadableRoots: the waypoint does not start without
// roots it can parse (fail closed), naming the flag.
func TestUpstreamRefusesUnreadableRoots(t *testing.T) {
	path := filepath.Join(t.TempDir(), "root-cert.pem")
	for _, content := range [][]byte{nil, []byte("no pem here")} {
		if content != nil {
			replaceFile(t, path, content)
		}
		o := &options{RootCert: path, XDSAddress: "cp:15012", CAAddress: "cp:15012"}
		if _, err := newUpstream(o, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "--root-cert") {
			t.Errorf("newUpstream with %q = %v, want an error naming --root-cert", content, err)
		}
	}
}
