// Package identity holds workload identities (SPIFFE ids of the form
// spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>) and the
// certificates that prove them. It defines CertSource, the narrow interface
// the data path (hbone/, proxy/) uses to get "the certificate for identity X"
// and its trust bundle, so the data path never imports the CA or the CA client.
//
// It is not a CA (see internal/controlplane/ca) and does not fetch or rotate
// certificates.
package identity

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// DefaultTrustDomain is the trust domain Istio assumes when none is given.
const DefaultTrustDomain = "cluster.local"

// ErrNotWorkloadID is returned for a SPIFFE id whose path is not /ns/<ns>/sa/<sa>.
var ErrNotWorkloadID = errors.New("not a workload identity (want spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>)")

// Identity is a workload's SPIFFE identity. The zero value means "no identity"
// (for example a plaintext peer). Identity is comparable: two identities are
// the same iff their three fields are equal.
type Identity struct {
	TrustDomain    string
	Namespace      string
	ServiceAccount string
}

// New builds an identity and validates it as a SPIFFE id.
func New(trustDomain, namespace, serviceAccount string) (Identity, error) {
	id := Identity{TrustDomain: trustDomain, Namespace: namespace, ServiceAccount: serviceAccount}
	if _, err := id.SPIFFEID(); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// MustNew is New for constants in tests and examples; it panics on error.
func MustNew(trustDomain, namespace, serviceAccount string) Identity {
	id, err := New(trustDomain, namespace, serviceAccount)
	if err != nil {
		panic(err)
	}
	return id
}

// Parse parses "spiffe://td/ns/<ns>/sa/<sa>".
func Parse(s string) (Identity, error) {
	sid, err := spiffeid.FromString(s)
	if err != nil {
		return Identity{}, fmt.Errorf("identity: parse %q: %w", s, err)
	}
	return FromSPIFFEID(sid)
}

// FromSPIFFEID converts a go-spiffe id, checking the /ns/<ns>/sa/<sa> path.
func FromSPIFFEID(sid spiffeid.ID) (Identity, error) {
	parts := strings.Split(strings.TrimPrefix(sid.Path(), "/"), "/")
	if len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" || parts[1] == "" || parts[3] == "" {
		return Identity{}, fmt.Errorf("identity: %q: %w", sid.String(), ErrNotWorkloadID)
	}
	return Identity{TrustDomain: sid.TrustDomain().Name(), Namespace: parts[1], ServiceAccount: parts[3]}, nil
}

// SPIFFEID returns the go-spiffe form of the identity.
func (i Identity) SPIFFEID() (spiffeid.ID, error) {
	td, err := spiffeid.TrustDomainFromString(i.TrustDomain)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("identity: trust domain %q: %w", i.TrustDomain, err)
	}
	sid, err := spiffeid.FromSegments(td, "ns", i.Namespace, "sa", i.ServiceAccount)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("identity: ns %q sa %q: %w", i.Namespace, i.ServiceAccount, err)
	}
	return sid, nil
}

// String prints the SPIFFE URI; the zero identity prints as "".
func (i Identity) String() string {
	if i.IsZero() {
		return ""
	}
	return "spiffe://" + i.TrustDomain + "/ns/" + i.Namespace + "/sa/" + i.ServiceAccount
}

// IsZero reports whether this is "no identity".
func (i Identity) IsZero() bool { return i == Identity{} }

// SameTrustDomain reports whether both identities share a trust domain.
func (i Identity) SameTrustDomain(o Identity) bool { return i.TrustDomain == o.TrustDomain }

// FromCertificate returns the workload identity carried in cert's URI SANs:
// the first SPIFFE URI that is a well-formed workload id. It fails when there
// is none.
func FromCertificate(cert *x509.Certificate) (Identity, error) {
	var firstErr error
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		id, err := Parse(u.String())
		if err == nil {
			return id, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return Identity{}, firstErr
	}
	return Identity{}, errors.New("identity: certificate has no SPIFFE URI SAN")
}
