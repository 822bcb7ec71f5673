package admin

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// writePair writes a self-signed certificate for 127.0.0.1 with common name
// cn, and its key, to certFile and keyFile (replacing them, as a Secret
// volume update does), and returns the certificate.
func writePair(t *testing.T, certFile, keyFile, cn string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for path, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "PRIVATE KEY", Bytes: kder}} {
		tmp := path + ".new"
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestStatsTLS: with STATS_TLS_CERT/KEY the stats port serves /metrics over
// HTTPS only (a plaintext scrape gets no metrics), a rotated pair is served
// from the next handshake on, and a broken rotation keeps the last good one.
func TestStatsTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := writePair(t, certFile, keyFile, "first")
	if _, err := daemon.LoadKeyPairFile(certFile, filepath.Join(dir, "missing.key"), nil); err == nil ||
		!strings.Contains(err.Error(), "missing.key") {
		t.Fatalf("a missing key: %v, want an error naming it", err)
	}
	kp, err := daemon.LoadKeyPairFile(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	deps, _ := testDeps(t)
	s, err := Listen(Config{StatsAddr: "127.0.0.1:0", StatsTLS: kp.TLSConfig()}, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	defer func() { cancel(); <-served }()
	addr := s.Addrs("stats")[0].String()

	// scrape trusts only want and returns the served certificate's name.
	scrape := func(want *x509.Certificate) (string, error) {
		pool := x509.NewCertPool()
		pool.AddCert(want)
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true,
		}}
		resp, err := c.Get("https://" + addr + "/metrics")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.Contains(string(body), "test_things_total 7") {
			t.Fatalf("GET /metrics over TLS = %d %.100q", resp.StatusCode, body)
		}
		return resp.TLS.PeerCertificates[0].Subject.CommonName, nil
	}
	if cn, err := scrape(first); err != nil || cn != "first" {
		t.Fatalf("TLS scrape: %q, %v", cn, err)
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "test_things_total") {
			t.Fatalf("a plaintext scrape got the metrics: %d %.100q", resp.StatusCode, body)
		}
	}

	second := writePair(t, certFile, keyFile, "second")
	testkit.Eventually(t, 10*time.Second, "the rotated certificate to be served", func() bool {
		cn, err := scrape(second)
		return err == nil && cn == "second"
	})

	// A broken rotation (a key that does not match) is not taken.
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // past the recheck interval
	if cn, err := scrape(second); err != nil || cn != "second" {
		t.Fatalf("after a broken rotation: %q, %v; want the last good certificate", cn, err)
	}
}
