package routing

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TestCompileTLS: the client side of TLS origination against a server
// with its own CA: the CA and a SAN it has verify; a SAN it does not have,
// or no CA (system roots), fail; insecureSkipVerify accepts anything; a
// CA that is not PEM is an error (the request fails closed).
func TestCompileTLS(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafT := &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: []string{"api.example.test"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	leafDER, _ := x509.CreateCertificate(rand.Reader, leafT, caCert, &leafKey.PublicKey, key)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	srvCfg := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}}}

	handshake := func(cfg *tls.Config) error {
		c1, c2 := net.Pipe()
		defer c1.Close()
		defer c2.Close()
		go func() { _ = tls.Server(c2, srvCfg).Handshake() }()
		return tls.Client(c1, cfg).Handshake()
	}
	for _, c := range []struct {
		name string
		ct   *waypointapi.ClientTLS
		ok   bool
	}{
		{"sni verified", &waypointapi.ClientTLS{Sni: "api.example.test", CaCertificates: caPEM}, true},
		{"hostname as sni", &waypointapi.ClientTLS{CaCertificates: caPEM}, false},
		{"san", &waypointapi.ClientTLS{Sni: "other", SubjectAltNames: []string{"x.test", "api.example.test"}, CaCertificates: caPEM}, true},
		{"wrong san", &waypointapi.ClientTLS{Sni: "api.example.test", SubjectAltNames: []string{"wrong.example.test"}, CaCertificates: caPEM}, false},
		{"system roots", &waypointapi.ClientTLS{Sni: "api.example.test"}, false},
		{"insecure", &waypointapi.ClientTLS{InsecureSkipVerify: true, SubjectAltNames: []string{"wrong"}}, true},
	} {
		cfg, err := compileTLS(c.ct, "ext.example.test")
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := handshake(cfg); (err == nil) != c.ok {
			t.Errorf("%s: handshake error %v, want ok=%v", c.name, err, c.ok)
		}
	}
	if _, err := compileTLS(&waypointapi.ClientTLS{CaCertificates: []byte("not pem")}, "h"); err == nil {
		t.Error("a CA that is not PEM compiled")
	}
	if _, err := compileTLS(&waypointapi.ClientTLS{Mutual: true, CertChain: []byte("x"), PrivateKey: []byte("y")}, "h"); err == nil {
		t.Error("a client certificate that does not parse compiled")
	}
}
