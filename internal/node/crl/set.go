package crl

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel-go/hbone"
)

// ErrRevoked is wrapped by every error that refuses or ends a connection
// because of a revoked certificate (errors.Is(err, ErrRevoked)). It is
// hbone.ErrRevoked, so the proxy classifies the connections it ends.
var ErrRevoked = hbone.ErrRevoked

// RevokedError names the revoked certificate of a peer chain and the CRL
// that revoked it.
type RevokedError struct {
	// Serial is the revoked certificate's serial number.
	Serial *big.Int
	// Subject is that certificate's subject (the peer's leaf at Position 0).
	Subject string
	// Position in the chain the peer presented: 0 is the leaf.
	Position int
	// Issuer is the CRL's issuer: a mesh trust root, or the intermediate
	// CA that issued the certificate.
	Issuer string
	// RevokedAt is the revocation date the CRL gives.
	RevokedAt time.Time
	// Unverified, when set, is why the certificate is refused without
	// being listed: a CRL names its issuer but does not verify against the
	// issuer certificate the peer presented (fail closed, as rustls-webpki
	// refuses a CRL whose signature does not verify).
	Unverified error
}

func (e *RevokedError) Error() string {
	what := "certificate"
	if e.Position > 0 {
		what = fmt.Sprintf("intermediate certificate (chain position %d)", e.Position)
	}
	if e.Unverified != nil {
		return fmt.Sprintf("crl: peer %s serial %s (%s): a CRL of its issuer %q does not verify against the issuer certificate presented (%v), so its revocation status is unknown: %s",
			what, SerialHex(e.Serial), e.Subject, e.Issuer, e.Unverified, ErrRevoked)
	}
	return fmt.Sprintf("crl: peer %s serial %s (%s) revoked by the CRL of %q: %s",
		what, SerialHex(e.Serial), e.Subject, e.Issuer, ErrRevoked)
}

// Unwrap makes errors.Is(err, ErrRevoked) hold.
func (e *RevokedError) Unwrap() error { return ErrRevoked }

// SerialHex formats a serial number as the config dump does (lower-case
// hex, no separators), so a serial in a log line can be found in
// /config_dump's certificates.
func SerialHex(n *big.Int) string {
	if n == nil {
		return ""
	}
	return n.Text(16)
}

// Set is one verified CRL bundle. It is immutable; the zero Set (and a nil
// *Set) revokes nothing.
type Set struct {
	lists    []*list
	byIssuer map[string][]*list // by the CRL's raw issuer DN
	// Sum is the SHA-256 of the file the Set was loaded from.
	Sum [sha256.Size]byte
}

type list struct {
	rl *x509.RevocationList
	// root is the trust root whose key signed it; nil for the CRL of an
	// intermediate CA, verified on use against the issuer certificate a
	// peer's chain presents (that certificate is itself verified up to a
	// root by the handshake), each issuer key once (checked).
	root    *x509.Certificate
	issuer  string
	revoked map[string]time.Time // serialKey → revocation time

	mu      sync.Mutex
	checked map[[sha256.Size]byte]error // issuer certificate → signature check
}

// verifiedBy checks l's signature against issuer (an intermediate from a
// peer's chain), once per issuer certificate.
func (l *list) verifiedBy(issuer *x509.Certificate) error {
	sum := sha256.Sum256(issuer.Raw)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err, ok := l.checked[sum]; ok {
		return err
	}
	err := l.rl.CheckSignatureFrom(issuer)
	if l.checked == nil {
		l.checked = map[[sha256.Size]byte]error{}
	}
	l.checked[sum] = err
	return err
}

// serialKey is a serial number as a map key: its sign and magnitude.
func serialKey(n *big.Int) string {
	if n == nil {
		return ""
	}
	if n.Sign() < 0 {
		return "-" + string(n.Bytes())
	}
	return string(n.Bytes())
}

// Parse reads a CRL bundle: PEM holding one or more "X509 CRL" blocks, or
// a single DER CRL. A file that is empty (or only whitespace) holds no CRL
// and revokes nothing, as in Istio's ztunnel. A PEM block of any other type,
// text outside PEM blocks, or a CRL that does not parse is an error naming
// the CRL's position (1-based).
func Parse(data []byte) ([]*x509.RevocationList, error) {
	l, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("crl: %w", err)
	}
	return l, nil
}

func parse(data []byte) ([]*x509.RevocationList, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, nil
	}
	if !bytes.HasPrefix(trimmed, []byte("-----BEGIN")) {
		rl, err := x509.ParseRevocationList(data)
		if err != nil {
			return nil, fmt.Errorf("DER CRL: %w", err)
		}
		return []*x509.RevocationList{rl}, nil
	}
	var out []*x509.RevocationList
	rest := trimmed
	for len(rest) > 0 {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, fmt.Errorf("text after PEM block %d is not a PEM block", len(out))
		}
		if b.Type != "X509 CRL" {
			return nil, fmt.Errorf("PEM block %d is %q, want \"X509 CRL\"", len(out)+1, b.Type)
		}
		rl, err := x509.ParseRevocationList(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("CRL %d: %w", len(out)+1, err)
		}
		out = append(out, rl)
		rest = bytes.TrimSpace(rest)
	}
	return out, nil
}

// Verify builds a Set from parsed CRLs. A CRL whose issuer names one of
// roots must be issued by it (subject key id equal to its authority key id
// when both are present) and carry its signature. A CRL of an issuer that is
// no root is an intermediate CA's (as Istio's plugged-in CAs issue them):
// it is verified when a peer's chain presents that issuer (Revoked). The
// first CRL that fails refuses them all, with an error naming it.
func Verify(lists []*x509.RevocationList, roots []*x509.Certificate) (*Set, error) {
	s, err := verify(lists, roots)
	if err != nil {
		return nil, fmt.Errorf("crl: %w", err)
	}
	return s, nil
}

func verify(lists []*x509.RevocationList, roots []*x509.Certificate) (*Set, error) {
	s := &Set{byIssuer: make(map[string][]*list)}
	for i, rl := range lists {
		root, err := issuerRoot(rl, roots)
		if errors.Is(err, errNotARoot) {
			root, err = nil, nil // an intermediate's: verified on use
		}
		if err != nil {
			return nil, fmt.Errorf("CRL %d (issuer %q): %w", i+1, rl.Issuer.String(), err)
		}
		l := &list{rl: rl, root: root, issuer: rl.Issuer.String(), revoked: make(map[string]time.Time, len(rl.RevokedCertificateEntries))}
		for _, e := range rl.RevokedCertificateEntries {
			l.revoked[serialKey(e.SerialNumber)] = e.RevocationTime
		}
		s.lists = append(s.lists, l)
		s.byIssuer[string(rl.RawIssuer)] = append(s.byIssuer[string(rl.RawIssuer)], l)
	}
	return s, nil
}

func issuerRoot(rl *x509.RevocationList, roots []*x509.Certificate) (*x509.Certificate, error) {
	var sigErr error
	named := false
	for _, r := range roots {
		if !bytes.Equal(r.RawSubject, rl.RawIssuer) {
			continue
		}
		named = true
		if len(rl.AuthorityKeyId) > 0 && len(r.SubjectKeyId) > 0 && !bytes.Equal(rl.AuthorityKeyId, r.SubjectKeyId) {
			sigErr = fmt.Errorf("not signed by the mesh trust root of that name (authority key id %x, the root's subject key id %x)",
				rl.AuthorityKeyId, r.SubjectKeyId)
			continue
		}
		if err := rl.CheckSignatureFrom(r); err != nil {
			sigErr = fmt.Errorf("signature does not verify against the mesh trust root: %w", err)
			continue
		}
		return r, nil
	}
	if !named {
		return nil, errNotARoot
	}
	return nil, sigErr
}

// errNotARoot: the CRL's issuer names none of the roots.
var errNotARoot = errors.New("issuer is not a mesh trust root")

// Revoked returns the first certificate of chain (leaf first, as the peer
// presented it) that a CRL of s lists: a CRL applies to the certificates
// its issuer issued (issuer DN equal, and authority key id equal to the
// issuer's subject key id when both are present). A root's CRL was
// verified at load; an intermediate's applies to a certificate signed by
// another certificate of chain (the intermediate), against which the CRL
// must verify, or the certificate is refused (Unverified). Nil when none
// is revoked.
func (s *Set) Revoked(chain []*x509.Certificate) *RevokedError {
	if s == nil || len(s.byIssuer) == 0 {
		return nil
	}
	for i, c := range chain {
		for _, l := range s.byIssuer[string(c.RawIssuer)] {
			issuer := l.root
			if issuer == nil {
				// An intermediate's CRL: it applies when the chain holds
				// the certificate that signed c (else the handshake
				// verified c against a root, whose CRLs are the ones that
				// apply). By signature, not by position or name: a peer
				// could add a certificate of the issuer's name with
				// another key id to make the CRL look like another's.
				if issuer = signerIn(chain, i); issuer == nil {
					continue
				}
				if len(l.rl.AuthorityKeyId) > 0 && len(issuer.SubjectKeyId) > 0 && !bytes.Equal(l.rl.AuthorityKeyId, issuer.SubjectKeyId) {
					continue // a CRL of another key of that name
				}
			}
			if len(c.AuthorityKeyId) > 0 && len(issuer.SubjectKeyId) > 0 && !bytes.Equal(c.AuthorityKeyId, issuer.SubjectKeyId) {
				continue
			}
			if l.root == nil {
				if err := l.verifiedBy(issuer); err != nil {
					return &RevokedError{Serial: c.SerialNumber, Subject: subjectOf(c), Position: i, Issuer: l.issuer, Unverified: err}
				}
			}
			if at, ok := l.revoked[serialKey(c.SerialNumber)]; ok {
				return &RevokedError{Serial: c.SerialNumber, Subject: subjectOf(c), Position: i, Issuer: l.issuer, RevokedAt: at}
			}
		}
	}
	return nil
}

// signerIn returns the certificate of chain, other than chain[i], whose
// key signed chain[i] (a CA of the name chain[i] gives as its issuer), or
// nil when none did.
func signerIn(chain []*x509.Certificate, i int) *x509.Certificate {
	c := chain[i]
	for j, p := range chain {
		if j != i && bytes.Equal(p.RawSubject, c.RawIssuer) && c.CheckSignatureFrom(p) == nil {
			return p
		}
	}
	return nil
}

// subjectOf names a certificate: its URI SANs (the SPIFFE id of a workload
// certificate), else its subject DN.
func subjectOf(c *x509.Certificate) string {
	if len(c.URIs) > 0 {
		s := c.URIs[0].String()
		for _, u := range c.URIs[1:] {
			s += " " + u.String()
		}
		return s
	}
	return c.Subject.String()
}

// Len is the number of CRLs in s.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.lists)
}

// Info describes one CRL of a Set for the config dump.
type Info struct {
	Issuer string `json:"issuer"`
	// IssuerKind is "root" (verified at load) or "intermediate" (verified
	// against the issuer certificate a peer presents).
	IssuerKind string    `json:"issuerKind"`
	Number     string    `json:"number,omitempty"`
	ThisUpdate time.Time `json:"thisUpdate"`
	NextUpdate time.Time `json:"nextUpdate,omitzero"`
	Revoked    int       `json:"revokedCertificates"`
}

// Infos describes the CRLs of s, in file order.
func (s *Set) Infos() []Info {
	if s == nil {
		return nil
	}
	out := make([]Info, 0, len(s.lists))
	for _, l := range s.lists {
		in := Info{Issuer: l.issuer, IssuerKind: "root", ThisUpdate: l.rl.ThisUpdate, NextUpdate: l.rl.NextUpdate, Revoked: len(l.revoked)}
		if l.root == nil {
			in.IssuerKind = "intermediate"
		}
		if l.rl.Number != nil {
			in.Number = l.rl.Number.String()
		}
		out = append(out, in)
	}
	return out
}
