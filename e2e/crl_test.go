package e2e

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testpki"
)

// TestCRLRevocation (issue 18, CRL row): the node proxies run with
// CRL_PATH (an empty bundle at first). A client pod on node0 holds a
// connection open to a server pod on node1 through the mesh; then a CRL
// signed by the mesh root (ztunnel-cp's, from its state dir) revoking the
// client's workload certificate is written. The server's node proxy picks
// it up, closes the open connection (one log line naming the serial and
// the peer) and refuses new handshakes from the client; a bundle that does
// not verify is refused and the revocation stays in force. Last, revoking
// the server's certificate closes the client node proxy's pooled
// connection to it (the outbound direction).
func TestCRLRevocation(t *testing.T) {
	roottest.Require(t)
	crlPath := filepath.Join(t.TempDir(), "ca-crl.pem")
	if err := os.WriteFile(crlPath, nil, 0o644); err != nil { // no revocations yet
		t.Fatal(err)
	}
	m, err := meshlab.Start(t, meshlab.Options{ProxyEnv: []string{"CRL_PATH=" + crlPath}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 120*time.Second)
	if err := m.AddNamespace("crl", ambientNS); err != nil {
		t.Fatal(err)
	}
	client, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: "crl-client", Namespace: "crl", ServiceAccount: "crl-client"})
	if err != nil {
		t.Fatal(err)
	}
	server, err := m.AddPod(ctx, 1, testcluster.PodSpec{Name: "crl-server", Namespace: "crl", ServiceAccount: "crl-server",
		Labels: map[string]string{"app": "crl-server"}, Containers: []kube.Container{{Name: "app", Ports: []kube.ContainerPort{{Name: "tcp-echo", Port: 8080}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, client.IP, server.IP); err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(server.IP, 8080)
	testkit.Eventually(t, waitTimeout, "a first round trip through the mesh", func() bool {
		got, err := meshlab.RoundTrip(ctxT(t, 5*time.Second), client, dst, []byte("warm"))
		return err == nil && string(got) == "warm"
	})

	// The long-lived connection, echoing before the revocation.
	c, err := client.Dial(ctx, "tcp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(45 * time.Second))
	buf := make([]byte, 5)
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo before the revocation: %q, %v", buf, err)
	}

	clientID := spiffe("crl", "crl-client")
	serial := workloadSerial(ctx, t, m, 0, clientID)
	root, key := meshRootKey(t, m)
	writeCRL(t, crlPath, signCRL(t, root, key, 1, serial))
	t.Logf("revoked %s serial %x", clientID, serial)

	// The open connection is closed well before its deadline (the node
	// proxy polls the file every 5 s).
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("connection still open after the revocation (read %d bytes)", n)
	} else if strings.Contains(err.Error(), "timeout") {
		t.Fatalf("connection not closed after the revocation: %v", err)
	}
	closure, err := waitProxyLine(ctx, m, 1, func(l map[string]any) bool {
		return l["msg"] == "closing connection: peer certificate revoked by CRL"
	})
	if err != nil {
		t.Fatal(err)
	}
	if closure["serial"] != serial.Text(16) || closure["peer"] != clientID || closure["direction"] != "inbound" {
		t.Fatalf("closure line %v: want serial %x, peer %s, inbound", closure, serial, clientID)
	}

	// The server's access line for it says why.
	if _, err := m.WaitAccessLog(ctx, 1, func(a meshlab.AccessLog) bool {
		return a.Str("direction") == "inbound" && a.Str("dst.workload") == "crl-server" && a.Str("reason") == "revoked" &&
			a.Str("src.identity") == clientID && a.Int("bytes_recv") == 5
	}); err != nil {
		t.Fatal(err)
	}

	// New connections are refused in the server's handshake.
	got, err := meshlab.RoundTrip(ctxT(t, 10*time.Second), client, dst, []byte("refused?"))
	if err == nil && len(got) > 0 {
		t.Fatalf("new connection answered %q after the revocation", got)
	}
	testkit.Eventually(t, waitTimeout, "a handshake rejection counted on node1", func() bool {
		mfs, err := m.Metrics(ctxT(t, 5*time.Second), 1)
		return err == nil && meshlab.Counter(mfs, "istio_crl_policy_rejections_total", map[string]string{"reporter": "destination", "stage": "handshake"}) >= 1
	})
	if mfs, err := m.Metrics(ctx, 1); err != nil ||
		meshlab.Counter(mfs, "istio_crl_policy_rejections_total", map[string]string{"reporter": "destination", "stage": "established"}) != 1 {
		t.Fatalf("established-connection closures on node1: %v", err)
	}
	// The rejection line names the revocation and the serial.
	if _, err := waitProxyLine(ctx, m, 1, func(l map[string]any) bool {
		e, _ := l["error"].(string)
		return l["msg"] == "hbone: rejected connection" && strings.Contains(e, "revoked by the CRL") && strings.Contains(e, serial.Text(16))
	}); err != nil {
		t.Fatal(err)
	}
	if crl := crlDump(ctx, t, m, 1); len(crl.CRLs) != 1 || crl.CRLs[0].Revoked != 1 || crl.LastError != "" {
		t.Fatalf("node1 config dump crl section: %+v", crl)
	}

	// A bundle that does not verify (signed by a key that is not the
	// mesh root's) is refused; the revocation stays in force.
	other := testpki.NewRootSubject(t, root.Subject)
	writeCRL(t, crlPath, signCRL(t, other.Cert, other.Key, 2))
	testkit.Eventually(t, waitTimeout, "the bad bundle refused on node1", func() bool {
		return strings.Contains(crlDump(ctxT(t, 5*time.Second), t, m, 1).LastError, "not signed by the mesh trust root")
	})
	if got, err := meshlab.RoundTrip(ctxT(t, 10*time.Second), client, dst, []byte("still?")); err == nil && len(got) > 0 {
		t.Fatalf("a refused bundle lifted the revocation: %q", got)
	}

	// A newer CRL without the client lifts it.
	writeCRL(t, crlPath, signCRL(t, root, key, 3))
	testkit.Eventually(t, waitTimeout, "the client allowed again", func() bool {
		got, err := meshlab.RoundTrip(ctxT(t, 5*time.Second), client, dst, []byte("again"))
		return err == nil && string(got) == "again"
	})

	// Outbound: revoking the server's certificate closes the client node
	// proxy's pooled connection to it.
	c2, err := client.Dial(ctx, "tcp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c2.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c2, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo before revoking the server: %q, %v", buf, err)
	}
	serverID := spiffe("crl", "crl-server")
	serverSerial := workloadSerial(ctx, t, m, 1, serverID)
	writeCRL(t, crlPath, signCRL(t, root, key, 4, serverSerial))
	if n, err := c2.Read(buf); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("connection to a revoked server still open: read %d, %v", n, err)
	}
	if _, err := waitProxyLine(ctx, m, 0, func(l map[string]any) bool {
		return l["msg"] == "closing connection: peer certificate revoked by CRL" && l["direction"] == "outbound" &&
			l["peer"] == serverID && l["serial"] == serverSerial.Text(16)
	}); err != nil {
		t.Fatal(err)
	}
}

// workloadSerial is the serial of id's certificate in node's config dump.
func workloadSerial(ctx context.Context, t *testing.T, m *meshlab.Mesh, node int, id string) *big.Int {
	t.Helper()
	raw, err := m.ConfigDump(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	var dump struct {
		Certificates []struct {
			Identity  string `json:"identity"`
			CertChain []struct {
				PEM string `json:"pem"`
			} `json:"certChain"`
		} `json:"certificates"`
	}
	if err := json.Unmarshal(raw, &dump); err != nil {
		t.Fatal(err)
	}
	for _, c := range dump.Certificates {
		if c.Identity != id || len(c.CertChain) == 0 {
			continue
		}
		b, _ := pem.Decode([]byte(c.CertChain[0].PEM))
		if b == nil {
			t.Fatalf("%s: leaf PEM does not decode", id)
		}
		leaf, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return leaf.SerialNumber
	}
	t.Fatalf("no certificate for %s in node%d's config dump", id, node)
	return nil
}

// meshRootKey reads the mesh root and its key from ztunnel-cp's state dir
// (root-cert.pem and root-key.pem side by side).
func meshRootKey(t *testing.T, m *meshlab.Mesh) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	certPEM, err := os.ReadFile(m.RootCert)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(filepath.Dir(m.RootCert), "root-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		t.Fatal("root certificate or key is not PEM")
	}
	root, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	var key any
	switch kb.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	}
	if err != nil {
		t.Fatalf("root key (%s): %v", kb.Type, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		t.Fatalf("root key %T cannot sign", key)
	}
	return root, signer
}

// signCRL is a PEM CRL number n by issuer revoking serials.
func signCRL(t *testing.T, issuer *x509.Certificate, key crypto.Signer, n int64, serials ...*big.Int) []byte {
	t.Helper()
	tmpl := &x509.RevocationList{Number: big.NewInt(n), ThisUpdate: time.Now().Add(-time.Minute), NextUpdate: time.Now().Add(time.Hour)}
	for _, s := range serials {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, issuer, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der})
}

// writeCRL replaces path atomically, as a volume update does.
func writeCRL(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type crlSection struct {
	CRLs []struct {
		Revoked int `json:"revokedCertificates"`
	} `json:"crls"`
	LastError string `json:"lastError"`
}

// crlDump is the "crl" section of node's config dump.
func crlDump(ctx context.Context, t *testing.T, m *meshlab.Mesh, node int) crlSection {
	t.Helper()
	raw, err := m.ConfigDump(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		CRL *crlSection `json:"crl"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	if d.CRL == nil {
		t.Fatalf("node%d's config dump has no crl section", node)
	}
	return *d.CRL
}
