package bootstrap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
)

// loadCA: --root-cert/--root-key, else the state dir's root, else a new root
// saved to the state dir (so node proxies keep trusting it after a restart).
func loadCA(o Options) (*ca.CA, error) {
	certPath, keyPath := o.RootCert, o.RootKey
	generated := false
	if certPath == "" {
		certPath, keyPath = filepath.Join(o.StateDir, "root-cert.pem"), filepath.Join(o.StateDir, "root-key.pem")
		if _, err := os.Stat(keyPath); errors.Is(err, fs.ErrNotExist) {
			generated = true
		}
	}
	opts := ca.Options{TrustDomain: o.TrustDomain}
	if !generated {
		var err error
		if opts.RootCertPEM, err = os.ReadFile(certPath); err != nil {
			return nil, fmt.Errorf("root cert: %w", err)
		}
		if opts.RootKeyPEM, err = os.ReadFile(keyPath); err != nil {
			return nil, fmt.Errorf("root key: %w", err)
		}
	}
	authority, err := ca.New(opts)
	if err != nil {
		return nil, err
	}
	if generated {
		key, err := authority.RootKeyPEM()
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(keyPath, key, 0o600); err != nil {
			return nil, fmt.Errorf("save root key: %w", err)
		}
	}
	return authority, nil
}
