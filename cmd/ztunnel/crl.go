package main

import (
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/crl"
)

// dumpKeyCRL is the config dump section of the CRLs in force.
const dumpKeyCRL = "crl"

// newRevocation loads CRL_PATH, verified against the mesh trust roots
// (CA_ROOT_CA, the root Istio publishes as istio-ca-root-cert), or returns
// nil when CRL_PATH is unset. A first load that fails stops the node proxy
// (crl.New): it was told to refuse revoked peers and cannot.
func newRevocation(cfg *config.Config, log *zap.Logger, reg prometheus.Registerer) (*crl.Manager, error) {
	if cfg.CRLPath == "" {
		return nil, nil
	}
	roots, err := meshRoots(cfg.CARootCA)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", config.EnvCRLPath, err)
	}
	m, err := crl.New(crl.Config{Path: cfg.CRLPath}, crl.Deps{Roots: roots, Log: log, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("%s: %w (the node proxy does not start without the CRLs it was told to enforce)", config.EnvCRLPath, err)
	}
	return m, nil
}

// meshRoots reads the roots CRLs must be signed by from a CA_ROOT_CA value:
// a file (re-read on every call, so a rotated root is seen) or inline PEM.
// The system pool cannot sign mesh CRLs and is refused.
func meshRoots(v string) (func() ([]*x509.Certificate, error), error) {
	parse := func(raw []byte, what string) ([]*x509.Certificate, error) {
		certs, err := identity.ParseCertificatesPEM(raw)
		if err != nil {
			return nil, fmt.Errorf("mesh trust roots (%s %s): %w", config.EnvCARootCA, what, err)
		}
		return certs, nil
	}
	switch {
	case v == config.RootSystem:
		return nil, fmt.Errorf("the CRLs are verified against the mesh trust roots, but %s is %s: name the mesh root file",
			config.EnvCARootCA, config.RootSystem)
	case strings.Contains(v, "-----BEGIN"):
		certs, err := parse([]byte(v), "inline PEM")
		if err != nil {
			return nil, err
		}
		return func() ([]*x509.Certificate, error) { return certs, nil }, nil
	default:
		return func() ([]*x509.Certificate, error) {
			raw, err := os.ReadFile(v)
			if err != nil {
				return nil, fmt.Errorf("mesh trust roots (%s): %w", config.EnvCARootCA, err)
			}
			return parse(raw, v)
		}, nil
	}
}

// revocationOf is m as the HBONE pools and servers take it: a nil
// interface, not a nil *crl.Manager, when there is none.
func revocationOf(m *crl.Manager) hbone.Revocation {
	if m == nil {
		return nil
	}
	return m
}

// crlDump is the config dump section of m; nil (no section) without CRLs.
func crlDump(m *crl.Manager) func() any {
	if m == nil {
		return nil
	}
	return func() any { return m.Dump() }
}
