package realnode

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

// pki is the node's certificates, as files under dir.
type pki struct {
	dir    string
	caPEM  []byte
	caKey  *ecdsa.PrivateKey
	ca     *x509.Certificate
	serial int64
}

func (p *pki) file(name string) string { return filepath.Join(p.dir, name) }

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ztg realnode CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("ca cert: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, caKey: key, ca: ca, serial: 1, caPEM: pemBlock("CERTIFICATE", der)}
	if err := os.WriteFile(p.file("ca.crt"), p.caPEM, 0o644); err != nil {
		return nil, err
	}
	// The ServiceAccount token signing key pair (RSA, as kube-apiserver's
	// default signing algorithm RS256 wants).
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("sa key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.file("sa.key"), pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.file("sa.pub"), pemBlock("PUBLIC KEY", pub), 0o644); err != nil {
		return nil, err
	}
	return p, nil
}

// issue writes name.crt and name.key: a leaf signed by the CA.
func (p *pki) issue(name string, subject pkix.Name, usage []x509.ExtKeyUsage, dns []string, ips []net.IP) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	p.serial++
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: subject,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage, DNSNames: dns, IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return fmt.Errorf("%s cert: %w", name, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.file(name+".crt"), pemBlock("CERTIFICATE", der), 0o644); err != nil {
		return err
	}
	return os.WriteFile(p.file(name+".key"), pemBlock("PRIVATE KEY", kder), 0o600)
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// kubeconfig writes a kubeconfig for the client certificate name.crt.
func (p *pki) kubeconfig(name, server string) (string, error) {
	path := p.file(name + ".kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: realnode
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: realnode
  context: {cluster: realnode, user: %s}
current-context: realnode
`, server, p.file("ca.crt"), name, p.file(name+".crt"), p.file(name+".key"), name)
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}
