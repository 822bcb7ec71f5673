package certmanager

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// DefaultRootPoll is how often a RootFile re-reads its file.
const DefaultRootPoll = 5 * time.Second

// RootFile is a PEM bundle of trusted roots (XDS_ROOT_CA, CA_ROOT_CA) kept
// in step with its file, as Istio 1.30's ztunnel reloads them: Run re-reads
// the file every few seconds and, when its content changed and the new
// bundle parses, swaps the pool; a bundle that does not parse (or a file
// that cannot be read, as during a ConfigMap's symlink swap) is logged and
// the previous pool keeps serving. Connections made after the swap verify
// against the new roots; established ones are not torn down. Pool is safe
// for concurrent use.
type RootFile struct {
	path string
	log  *zap.Logger
	pool atomic.Pointer[x509.CertPool]

	mu       sync.Mutex // serialises Reload
	seen     [sha256.Size]byte
	accepted [sha256.Size]byte
	readErr  string // last read error logged, to log each once
}

// LoadRootFile reads and parses path; the first read must succeed. log
// receives reload and failure lines (nil: none).
func LoadRootFile(path string, log *zap.Logger) (*RootFile, error) {
	if log == nil {
		log = zap.NewNop()
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("certmanager: root certificates: %w", err)
	}
	pool, n, err := ParseRoots(raw)
	if err != nil {
		return nil, fmt.Errorf("certmanager: root certificates %s: %w", path, err)
	}
	r := &RootFile{path: path, log: log.With(zap.String("file", path))}
	r.pool.Store(pool)
	r.seen, r.accepted = sha256.Sum256(raw), sha256.Sum256(raw)
	r.log.Info("root certificates loaded", zap.Int("certificates", n))
	return r, nil
}

// Path is the file's path.
func (r *RootFile) Path() string { return r.path }

// Pool returns the roots in force.
func (r *RootFile) Pool() *x509.CertPool { return r.pool.Load() }

// Run re-reads the file every interval (<= 0: DefaultRootPoll) until ctx is
// done; it always returns nil.
func (r *RootFile) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = DefaultRootPoll
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_, _ = r.Reload()
		}
	}
}

// Reload reads the file now. It reports whether the roots changed; an error
// says why new content was refused (the previous roots stay in force).
// Content already seen (accepted or refused) is not parsed or logged again.
func (r *RootFile) Reload() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	raw, err := os.ReadFile(r.path)
	if err != nil {
		if msg := err.Error(); msg != r.readErr {
			r.readErr = msg
			r.log.Warn("root certificates: cannot read the file; keeping the previous roots", zap.Error(err))
		}
		return false, err
	}
	r.readErr = ""
	sum := sha256.Sum256(raw)
	if sum == r.seen {
		return false, nil
	}
	r.seen = sum
	pool, n, err := ParseRoots(raw)
	if err != nil {
		err = fmt.Errorf("certmanager: root certificates %s: %w", r.path, err)
		r.log.Error("root certificates changed but do not parse; keeping the previous roots", zap.Error(err))
		return false, err
	}
	if sum == r.accepted {
		return false, nil // back to the bundle in force after a refused one
	}
	r.accepted = sum
	r.pool.Store(pool)
	r.log.Info("root certificates reloaded", zap.Int("certificates", n))
	return true, nil
}

// ParseRoots parses a PEM bundle strictly: every CERTIFICATE block must be
// a valid certificate, and there must be at least one. It returns the pool
// and the number of certificates.
func ParseRoots(raw []byte) (*x509.CertPool, int, error) {
	pool := x509.NewCertPool()
	n := 0
	rest := raw
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, 0, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if len(bytes.TrimSpace(rest)) > 0 && n == 0 {
		return nil, 0, errors.New("no PEM certificate (the file is not PEM)")
	}
	if n == 0 {
		return nil, 0, errors.New("no PEM certificate")
	}
	return pool, n, nil
}
