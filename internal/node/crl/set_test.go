package crl

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	root := newRoot(t, "root")
	a, b := root.crl(t, 1, big.NewInt(7)), root.crl(t, 2, big.NewInt(8), big.NewInt(9))
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.cert.Raw})
	for _, tc := range []struct {
		name    string
		data    []byte
		want    int    // CRLs parsed
		wantErr string // substring; "" means success
	}{
		{"empty file revokes nothing", nil, 0, ""},
		{"whitespace only", []byte(" \n\t\n"), 0, ""},
		{"one PEM CRL", pemCRL(a), 1, ""},
		{"two PEM CRLs concatenated", pemCRL(a, b), 2, ""},
		{"PEM with blank lines around", append(append([]byte("\n\n"), pemCRL(a)...), '\n'), 1, ""},
		{"DER", a, 1, ""},
		{"certificate instead of CRL", cert, 0, `PEM block 1 is "CERTIFICATE"`},
		{"CRL then certificate", append(pemCRL(a), cert...), 0, `PEM block 2 is "CERTIFICATE"`},
		{"text after the PEM", append(pemCRL(a), []byte("garbage")...), 0, "text after PEM block 1"},
		{"corrupt PEM CRL", pemCRL([]byte("not a crl")), 0, "CRL 1:"},
		{"corrupt DER", []byte("not a crl"), 0, "DER CRL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.data)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse: err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(got) != tc.want {
				t.Fatalf("Parse: %d CRLs, %v; want %d", len(got), err, tc.want)
			}
		})
	}
}

func parse1(t *testing.T, der []byte) []*x509.RevocationList {
	t.Helper()
	l, err := Parse(der)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestVerify(t *testing.T) {
	root, other := newRoot(t, "root"), newRoot(t, "other root")
	impostor := newCA(t, "root", nil) // same name as root, another key
	inter := newCA(t, "intermediate", root)
	for _, tc := range []struct {
		name    string
		crl     []byte
		roots   []*x509.Certificate
		wantErr string
	}{
		{"signed by the root", root.crl(t, 1, big.NewInt(5)), []*x509.Certificate{other.cert, root.cert}, ""},
		{"signed by a key of the root's name", impostor.crl(t, 1), []*x509.Certificate{root.cert}, "not signed by the mesh trust root of that name (authority key id"},
		// Not a root's: an intermediate's, verified on use (TestRevokedByIntermediate).
		{"issuer is not a root", other.crl(t, 1), []*x509.Certificate{root.cert}, ""},
		{"intermediate CA's CRL", inter.crl(t, 1), []*x509.Certificate{root.cert}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Verify(parse1(t, tc.crl), tc.roots)
			if tc.wantErr == "" {
				if err != nil || s.Len() != 1 {
					t.Fatalf("Verify: %v (%d CRLs)", err, s.Len())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "CRL 1 (issuer") {
				t.Fatalf("Verify: err %v, want one naming CRL 1 and containing %q", err, tc.wantErr)
			}
		})
	}
	t.Run("a bad signature without key ids", func(t *testing.T) {
		// Tamper with a signed CRL's signature: the key id check passes,
		// the signature check must not.
		der := root.crl(t, 1, big.NewInt(5))
		rl := parse1(t, der)[0]
		rl.Signature = append([]byte(nil), rl.Signature...)
		rl.Signature[len(rl.Signature)-1] ^= 0xff
		_, err := Verify([]*x509.RevocationList{rl}, []*x509.Certificate{root.cert})
		if err == nil || !strings.Contains(err.Error(), "signature does not verify against the mesh trust root") {
			t.Fatalf("Verify of a tampered CRL: %v", err)
		}
	})
	t.Run("one bad CRL refuses the bundle", func(t *testing.T) {
		lists := append(parse1(t, root.crl(t, 1)), parse1(t, impostor.crl(t, 1))...)
		if _, err := Verify(lists, []*x509.Certificate{root.cert}); err == nil || !strings.Contains(err.Error(), "CRL 2") {
			t.Fatalf("Verify: %v, want CRL 2 refused", err)
		}
	})
}

func TestRevoked(t *testing.T) {
	root, other := newRoot(t, "root"), newRoot(t, "other root")
	inter := newCA(t, "intermediate", root)
	client := root.leaf(t, "spiffe://cluster.local/ns/a/sa/client")
	server := root.leaf(t, "spiffe://cluster.local/ns/a/sa/server")
	viaInter := inter.leaf(t, "spiffe://cluster.local/ns/a/sa/deep")
	// A certificate of another CA that happens to have client's serial.
	lookalike := &x509.Certificate{SerialNumber: client.SerialNumber, RawIssuer: other.cert.RawSubject, AuthorityKeyId: other.cert.SubjectKeyId}

	s, err := Verify(parse1(t, root.crl(t, 1, client.SerialNumber, inter.cert.SerialNumber)), []*x509.Certificate{root.cert, other.cert})
	if err != nil {
		t.Fatal(err)
	}
	re := s.Revoked([]*x509.Certificate{client})
	if re == nil || re.Serial.Cmp(client.SerialNumber) != 0 || re.Position != 0 ||
		re.Subject != "spiffe://cluster.local/ns/a/sa/client" || !strings.Contains(re.Issuer, "CN=root") {
		t.Fatalf("client: %+v", re)
	}
	if !errors.Is(re, ErrRevoked) || !strings.Contains(re.Error(), SerialHex(client.SerialNumber)) {
		t.Fatalf("error %q: not ErrRevoked or no serial", re)
	}
	if re := s.Revoked([]*x509.Certificate{server}); re != nil {
		t.Fatalf("server not revoked, got %v", re)
	}
	if re := s.Revoked([]*x509.Certificate{lookalike}); re != nil {
		t.Fatalf("another CA's certificate with the same serial: %v", re)
	}
	// The intermediate is revoked by the root's CRL: a leaf under it is refused at position 1.
	if re := s.Revoked([]*x509.Certificate{viaInter, inter.cert}); re == nil || re.Position != 1 ||
		!strings.Contains(re.Error(), "intermediate certificate (chain position 1)") {
		t.Fatalf("chain through a revoked intermediate: %v", re)
	}
	var none *Set
	if none.Revoked([]*x509.Certificate{client}) != nil || (&Set{}).Revoked([]*x509.Certificate{client}) != nil {
		t.Fatal("an empty Set revokes nothing")
	}
	empty, err := Verify(nil, []*x509.Certificate{root.cert})
	if err != nil || empty.Revoked([]*x509.Certificate{client}) != nil {
		t.Fatalf("Set of no CRLs: %v", err)
	}
}

// BenchmarkRevoked is the per-handshake cost with a CRL in force.
func BenchmarkRevoked(b *testing.B) {
	t := &testing.T{}
	root := newRoot(t, "root")
	var serials []*big.Int
	for i := range 1000 {
		serials = append(serials, big.NewInt(int64(1_000_000+i)))
	}
	l, _ := Parse(root.crl(t, 1, serials...))
	s, err := Verify(l, []*x509.Certificate{root.cert})
	if err != nil {
		b.Fatal(err)
	}
	chain := []*x509.Certificate{root.leaf(t, "spiffe://cluster.local/ns/a/sa/b")}
	b.ReportAllocs()
	for b.Loop() {
		if s.Revoked(chain) != nil {
			b.Fatal("revoked")
		}
	}
}

// TestRevokedByIntermediate: the CRL of an intermediate CA (as Istio's
// plugged-in CAs issue ca-crl.pem) revokes the leaves it issued when a
// peer presents the chain through it; it is checked against that
// intermediate, so a CRL of the intermediate's name signed by another key
// refuses the peer (fail closed) and one for another intermediate key
// (authority key id) does not apply. A root's CRL still revokes the
// intermediate itself.
func TestRevokedByIntermediate(t *testing.T) {
	root := newRoot(t, "root")
	inter := newCA(t, "intermediate", root)
	forger := newCA(t, "intermediate", nil) // the intermediate's name, another key
	deep := inter.leaf(t, "spiffe://cluster.local/ns/a/sa/deep")
	fine := inter.leaf(t, "spiffe://cluster.local/ns/a/sa/fine")
	rootLeaf := root.leaf(t, "spiffe://cluster.local/ns/a/sa/direct")
	roots := []*x509.Certificate{root.cert}

	s, err := Verify(parse1(t, inter.crl(t, 1, deep.SerialNumber, rootLeaf.SerialNumber)), roots)
	if err != nil {
		t.Fatal(err)
	}
	if in := s.Infos(); len(in) != 1 || in[0].IssuerKind != "intermediate" {
		t.Fatalf("infos %+v, want one intermediate CRL", in)
	}
	re := s.Revoked([]*x509.Certificate{deep, inter.cert})
	if re == nil || re.Unverified != nil || re.Position != 0 || !strings.Contains(re.Issuer, "CN=intermediate") || !errors.Is(re, ErrRevoked) {
		t.Fatalf("leaf of the intermediate, listed: %+v", re)
	}
	if re := s.Revoked([]*x509.Certificate{fine, inter.cert}); re != nil {
		t.Fatalf("leaf of the intermediate, not listed: %v", re)
	}
	// The intermediate's CRL says nothing of the root's leaves, whatever
	// their serial.
	if re := s.Revoked([]*x509.Certificate{rootLeaf}); re != nil {
		t.Fatalf("a root-issued leaf: %v", re)
	}
	// Twice: the signature check is cached, the answer the same.
	if re := s.Revoked([]*x509.Certificate{deep, inter.cert}); re == nil {
		t.Fatal("second check of the same chain: not revoked")
	}

	forged, err := Verify(parse1(t, forger.crl(t, 1)), roots)
	if err != nil {
		t.Fatal(err)
	}
	// The forger's CRL carries its own key id, which is not the
	// intermediate's: it does not apply.
	if re := forged.Revoked([]*x509.Certificate{fine, inter.cert}); re != nil {
		t.Fatalf("a CRL for another key of the intermediate's name applied: %v", re)
	}
	// Without key ids to tell them apart, its signature must fail: refused.
	rl := parse1(t, forger.crl(t, 1))[0]
	rl.AuthorityKeyId = nil
	noKid, err := Verify([]*x509.RevocationList{rl}, roots)
	if err != nil {
		t.Fatal(err)
	}
	noKidLeaf := *fine
	noKidLeaf.AuthorityKeyId = nil
	re = noKid.Revoked([]*x509.Certificate{&noKidLeaf, inter.cert})
	if re == nil || re.Unverified == nil || !strings.Contains(re.Error(), "does not verify against the issuer certificate presented") {
		t.Fatalf("a CRL of the intermediate's name that does not verify: %v, want the peer refused", re)
	}

	// The root revokes the intermediate: every leaf under it is refused.
	both, err := Verify(append(parse1(t, root.crl(t, 2, inter.cert.SerialNumber)), parse1(t, inter.crl(t, 3))...), roots)
	if err != nil {
		t.Fatal(err)
	}
	if re := both.Revoked([]*x509.Certificate{fine, inter.cert}); re == nil || re.Position != 1 {
		t.Fatalf("leaf under a revoked intermediate: %v", re)
	}
}

// TestRevokedByIntermediateDecoy: a revoked leaf whose peer adds, before
// the real intermediate, a decoy CA of the intermediate's name and another
// key id (so the CRL would look like another key's) is still revoked: the
// CRL's CA is found by who signed the leaf, not by position or name.
func TestRevokedByIntermediateDecoy(t *testing.T) {
	root := newRoot(t, "root")
	inter := newCA(t, "intermediate", root)
	decoy := newCA(t, "intermediate", nil)
	revoked := inter.leaf(t, "spiffe://cluster.local/ns/a/sa/revoked")
	s, err := Verify(parse1(t, inter.crl(t, 1, revoked.SerialNumber)), []*x509.Certificate{root.cert})
	if err != nil {
		t.Fatal(err)
	}
	for name, chain := range map[string][]*x509.Certificate{
		"decoy first":   {revoked, decoy.cert, inter.cert},
		"decoy last":    {revoked, inter.cert, decoy.cert},
		"no decoy":      {revoked, inter.cert},
		"reversed tail": {inter.cert, revoked},
	} {
		if re := s.Revoked(chain); re == nil || re.Unverified != nil || re.Serial.Cmp(revoked.SerialNumber) != 0 {
			t.Errorf("%s: %v, want the leaf revoked", name, re)
		}
	}
	// Without the intermediate the CRL cannot apply (and the handshake
	// would not verify the chain).
	if re := s.Revoked([]*x509.Certificate{revoked, decoy.cert}); re != nil {
		t.Errorf("chain without the signer: %v", re)
	}
}
