package main

import (
	"crypto/x509"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/crl"
)

// newRevocation loads --crl-path (CRL_PATH, the same bundle the node
// proxies enforce), each CRL verified against the mesh root of --root-cert,
// or returns nil when it is unset. A first load that fails stops the
// waypoint: it was told to refuse revoked peers and cannot. Without it a
// revoked workload would still reach every service behind a waypoint, since
// the destination's node proxy sees only the waypoint's certificate.
func newRevocation(o *options, log *zap.Logger, reg prometheus.Registerer) (*crl.Manager, error) {
	if o.CRLPath == "" {
		return nil, nil
	}
	roots := func() ([]*x509.Certificate, error) {
		raw, err := os.ReadFile(o.RootCert)
		if err != nil {
			return nil, fmt.Errorf("mesh trust roots (--root-cert): %w", err)
		}
		certs, err := identity.ParseCertificatesPEM(raw)
		if err != nil {
			return nil, fmt.Errorf("mesh trust roots (--root-cert %s): %w", o.RootCert, err)
		}
		return certs, nil
	}
	m, err := crl.New(crl.Config{Path: o.CRLPath}, crl.Deps{Roots: roots, Log: log, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("--crl-path: %w (the waypoint does not start without the CRLs it was told to enforce)", err)
	}
	return m, nil
}

// revocationOf is m as HBONE takes it: a nil interface, not a nil
// *crl.Manager, when there is none.
func revocationOf(m *crl.Manager) hbone.Revocation {
	if m == nil {
		return nil
	}
	return m
}
