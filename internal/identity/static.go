package identity

import (
	"context"
	"fmt"
	"sync"
)

// StaticSource is a CertSource over a fixed set of certificates, for tests,
// benchmarks and static deployments. Set replaces a certificate.
type StaticSource struct {
	mu    sync.RWMutex
	certs map[Identity]*WorkloadCertificate
}

// NewStaticSource returns a source holding certs.
func NewStaticSource(certs ...*WorkloadCertificate) *StaticSource {
	s := &StaticSource{certs: make(map[Identity]*WorkloadCertificate, len(certs))}
	for _, c := range certs {
		s.certs[c.Identity] = c
	}
	return s
}

// Set stores (or replaces) the certificate for c.Identity.
func (s *StaticSource) Set(c *WorkloadCertificate) {
	s.mu.Lock()
	s.certs[c.Identity] = c
	s.mu.Unlock()
}

// Fetch implements CertSource.
func (s *StaticSource) Fetch(_ context.Context, id Identity) (*WorkloadCertificate, error) {
	s.mu.RLock()
	c := s.certs[id]
	s.mu.RUnlock()
	if c == nil {
		return nil, fmt.Errorf("identity: no certificate for %s", id)
	}
	return c, nil
}
