package caserver

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// DefaultServingNames are the names istiod's serving certificate covers
// (clients dial istiod.istio-system.svc:15012) plus loopback.
func DefaultServingNames(rootNamespace string) []string {
	return []string{
		"istiod." + rootNamespace + ".svc",
		"istiod." + rootNamespace + ".svc.cluster.local",
		"istiod",
		"localhost",
		"127.0.0.1",
		"::1",
	}
}

// ServingCertificate issues the control plane's own TLS server certificate
// for names (DNS names or IPs), signed by c's root, valid for ttl (capped by
// the root's expiry). The CA package signs only SPIFFE workload
// certificates, so this signs with the root key directly.
func ServingCertificate(c *ca.CA, names []string, ttl time.Duration) (tls.Certificate, error) {
	keyPEM, err := c.RootKeyPEM()
	if err != nil {
		return tls.Certificate{}, err
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return tls.Certificate{}, errors.New("caserver: root key PEM")
	}
	rootKey, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("caserver: root key: %w", err)
	}
	key, err := identity.GenerateKey()
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("caserver: serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial.Add(serial, big.NewInt(1)),
		Subject:      pkix.Name{CommonName: "ztunnel-go control plane"},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if tmpl.NotAfter.After(c.Root().NotAfter) {
		tmpl.NotAfter = c.Root().NotAfter
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if n != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Root(), key.Public(), rootKey)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("caserver: sign serving certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der, c.Root().Raw}, PrivateKey: key}, nil
}
