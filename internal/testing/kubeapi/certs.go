package kubeapi

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certSet is the PKI of one Server, written under its directory.
type certSet struct {
	caPEM []byte
	pool  *x509.CertPool

	adminCertPEM, adminKeyPEM []byte

	caFile, servingCertFile, servingKeyFile string
	adminCertFile, adminKeyFile             string
	saKeyFile, saPubFile                    string
}

// writeCerts makes a CA, a serving certificate for the API server's loopback
// and in-cluster names, an admin client certificate in system:masters and an
// RSA ServiceAccount signing key pair, and writes them as PEM files in dir.
func writeCerts(dir string) (*certSet, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubeapi test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("ca cert: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("ca cert: %w", err)
	}
	issue := func(serial int64, tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore = now.Add(-time.Hour)
		tmpl.NotAfter = now.Add(7 * 24 * time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		kder, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		return pemBlock("CERTIFICATE", der), pemBlock("PRIVATE KEY", kder), nil
	}
	servingCert, servingKey, err := issue(2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	})
	if err != nil {
		return nil, fmt.Errorf("serving cert: %w", err)
	}
	adminCert, adminKey, err := issue(3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kubeapi-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("admin cert: %w", err)
	}
	// RSA, as Kubernetes' own tooling uses; 2048 bits keeps Start fast.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}
	saDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}

	c := &certSet{
		caPEM:        pemBlock("CERTIFICATE", caDER),
		pool:         x509.NewCertPool(),
		adminCertPEM: adminCert,
		adminKeyPEM:  adminKey,
	}
	c.pool.AddCert(ca)
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, fmt.Errorf("pki dir: %w", err)
	}
	for _, f := range []struct {
		path *string
		name string
		data []byte
	}{
		{&c.caFile, "ca.crt", c.caPEM},
		{&c.servingCertFile, "apiserver.crt", servingCert},
		{&c.servingKeyFile, "apiserver.key", servingKey},
		{&c.adminCertFile, "admin.crt", adminCert},
		{&c.adminKeyFile, "admin.key", adminKey},
		{&c.saKeyFile, "sa.key", pemBlock("PRIVATE KEY", saDER)},
		{&c.saPubFile, "sa.pub", pemBlock("PUBLIC KEY", saPub)},
	} {
		*f.path = filepath.Join(pki, f.name)
		if err := os.WriteFile(*f.path, f.data, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	return c, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
