package certmanager

import (
	"crypto/x509"
	"encoding/pem"
	"sort"
	"time"
)

// Certificate states in a dump, as Istio's ztunnel names them.
const (
	StateAvailable    = "Available"    // a valid certificate is being served
	StateInitializing = "Initializing" // no valid certificate yet; a fetch is in progress
	StateUnavailable  = "Unavailable"  // no valid certificate; the last fetch failed (see LastError)
)

// CertDump is one identity in the admin config dump, shaped like the
// "certificates" entries of Istio ztunnel's config_dump (plus lastError and
// nextRefresh).
type CertDump struct {
	Identity  string     `json:"identity"`
	State     string     `json:"state"`
	LastError string     `json:"lastError,omitempty"`
	CertChain []CertInfo `json:"certChain"`
	RootCerts []CertInfo `json:"rootCerts"`
	// NextRefresh is when the next renewal or retry starts (RFC 3339); empty
	// while a fetch is in progress.
	NextRefresh string `json:"nextRefresh,omitempty"`
}

// CertInfo describes one certificate of a dump.
type CertInfo struct {
	PEM            string `json:"pem"`
	SerialNumber   string `json:"serialNumber"`
	ValidFrom      string `json:"validFrom"`
	ExpirationTime string `json:"expirationTime"`
}

// Dump reports every tracked identity, sorted by identity. Certificate
// chains are the leaf first, then intermediates.
func (m *Manager) Dump() []CertDump {
	type snap struct {
		d    CertDump
		cert []*x509.Certificate
		root []*x509.Certificate
	}
	m.mu.Lock()
	now := m.clock.Now()
	snaps := make([]snap, 0, len(m.entries))
	for id, e := range m.entries {
		s := snap{d: CertDump{Identity: id.String()}}
		switch {
		case e.cert != nil && now.Before(e.cert.NotAfter()):
			s.d.State = StateAvailable
		case e.fetching:
			s.d.State = StateInitializing
		default:
			s.d.State = StateUnavailable
		}
		if e.lastErr != nil {
			s.d.LastError = e.lastErr.Error()
		}
		if !e.nextAttempt.IsZero() {
			s.d.NextRefresh = e.nextAttempt.UTC().Format(time.RFC3339)
		}
		if e.cert != nil {
			for _, der := range e.cert.TLS.Certificate {
				c, err := x509.ParseCertificate(der)
				if err == nil {
					s.cert = append(s.cert, c)
				}
			}
			s.root = e.cert.RootCerts
		}
		snaps = append(snaps, s)
	}
	m.mu.Unlock()

	out := make([]CertDump, len(snaps))
	for i, s := range snaps {
		s.d.CertChain = certInfos(s.cert)
		s.d.RootCerts = certInfos(s.root)
		out[i] = s.d
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Identity < out[j].Identity })
	return out
}

func certInfos(certs []*x509.Certificate) []CertInfo {
	out := make([]CertInfo, 0, len(certs))
	for _, c := range certs {
		out = append(out, CertInfo{
			PEM:            string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})),
			SerialNumber:   c.SerialNumber.String(), // decimal, as Istio ztunnel prints it
			ValidFrom:      c.NotBefore.UTC().Format(time.RFC3339),
			ExpirationTime: c.NotAfter.UTC().Format(time.RFC3339),
		})
	}
	return out
}
