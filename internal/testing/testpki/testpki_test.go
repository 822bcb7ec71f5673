package testpki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"testing"
)

// TestChainVerifies: a workload leaf under an intermediate verifies against
// the root pool with the intermediate TLS sends, and its serial is what a
// CRL from the intermediate lists.
func TestChainVerifies(t *testing.T) {
	root := NewRoot(t, "root")
	inter := root.NewIntermediate(t, "intermediate")
	leaf := inter.Workload(t, "spiffe://cluster.local/ns/demo/sa/client")
	chain := leaf.TLS()
	if len(chain.Certificate) != 2 {
		t.Fatalf("TLS chain has %d certificates, want leaf and intermediate", len(chain.Certificate))
	}
	inters := x509.NewCertPool()
	inters.AddCert(inter.Cert)
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: inter.Pool(), Intermediates: inters,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if got := leaf.Cert.URIs[0].String(); got != "spiffe://cluster.local/ns/demo/sa/client" || len(leaf.Cert.URIs) != 1 {
		t.Errorf("URI SANs = %v", leaf.Cert.URIs)
	}
	b, _ := pem.Decode(inter.CRL(t, leaf.Cert.SerialNumber))
	rl, err := x509.ParseRevocationList(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.CheckSignatureFrom(inter.Cert); err != nil {
		t.Fatalf("CRL signature: %v", err)
	}
	if len(rl.RevokedCertificateEntries) != 1 || rl.RevokedCertificateEntries[0].SerialNumber.Cmp(leaf.Cert.SerialNumber) != 0 {
		t.Errorf("CRL revokes %v, want the leaf's serial", rl.RevokedCertificateEntries)
	}
	if n := inter.CRL(t); n == nil {
		t.Fatal("second CRL")
	} else if b2, _ := pem.Decode(n); b2 == nil {
		t.Fatal("second CRL is not PEM")
	} else if rl2, _ := x509.ParseRevocationList(b2.Bytes); rl2.Number.Cmp(rl.Number) <= 0 {
		t.Errorf("CRL numbers %v then %v, want increasing", rl.Number, rl2.Number)
	}
}

// TestServerHandshake: a server leaf for an IP and a name serves TLS that a
// client trusting only the root accepts under either name.
func TestServerHandshake(t *testing.T) {
	root := NewRoot(t, "root")
	srv := root.Server(t, "127.0.0.1", "svc.test")
	if _, err := tls.X509KeyPair(srv.CertPEM(), srv.KeyPEM(t)); err != nil {
		t.Fatalf("PEM pair: %v", err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srv.TLS()}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	for _, name := range []string{"127.0.0.1", "svc.test"} {
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: root.Pool(), ServerName: name})
		if err != nil {
			t.Errorf("dial as %s: %v", name, err)
			continue
		}
		c.Close()
	}
	if _, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: NewRoot(t, "other").Pool(), ServerName: "svc.test"}); err == nil {
		t.Error("a client trusting another root accepted the server")
	}
	if len(srv.Cert.IPAddresses) != 1 || !srv.Cert.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")) {
		t.Errorf("IP SANs = %v", srv.Cert.IPAddresses)
	}
}
