package crl

import (
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testpki"
)

// testCA is a testpki CA with the short names these tests use.
type testCA struct {
	*testpki.CA
	cert *x509.Certificate
}

func newRoot(t *testing.T, name string) *testCA {
	t.Helper()
	return newCA(t, name, nil)
}

// newCA makes a CA named name signed by parent; nil parent makes a root.
func newCA(t *testing.T, name string, parent *testCA) *testCA {
	t.Helper()
	var ca *testpki.CA
	if parent == nil {
		ca = testpki.NewRoot(t, name)
	} else {
		ca = parent.NewIntermediate(t, name)
	}
	return &testCA{CA: ca, cert: ca.Cert}
}

// leaf issues a workload certificate for spiffe id.
func (ca *testCA) leaf(t *testing.T, id string) *x509.Certificate {
	t.Helper()
	return ca.Workload(t, id).Cert
}

// crl returns a DER CRL by ca revoking serials.
func (ca *testCA) crl(t *testing.T, number int64, serials ...*big.Int) []byte {
	t.Helper()
	return ca.CRLDER(t, number, serials...)
}

func pemCRL(ders ...[]byte) []byte {
	var out []byte
	for _, d := range ders {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: d})...)
	}
	return out
}
