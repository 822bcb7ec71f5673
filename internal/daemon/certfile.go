package daemon

import (
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// KeyPairFile is a TLS certificate and key kept in two files (a mounted
// Secret, say) and read again when either changes, so a rotated certificate
// is served from the next handshake on without a restart. A pair that fails
// to load after a change is logged and the last good one kept: the server
// never falls back to plaintext.
type KeyPairFile struct {
	certFile, keyFile string
	log               *zap.Logger
	// recheck is how long a loaded pair is served before the files' stamps
	// are looked at again.
	recheck time.Duration

	mu      sync.Mutex
	cur     *tls.Certificate
	stamps  [2]FileStamp
	checked time.Time
}

// LoadKeyPairFile reads the pair once; an unreadable or mismatched pair is
// an error naming the files (a server asked to serve TLS must not start
// without it). log may be nil.
func LoadKeyPairFile(certFile, keyFile string, log *zap.Logger) (*KeyPairFile, error) {
	if log == nil {
		log = zap.NewNop()
	}
	k := &KeyPairFile{certFile: certFile, keyFile: keyFile, log: log, recheck: time.Second}
	if err := k.load(); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *KeyPairFile) load() error {
	cs, err := StatStamp(k.certFile)
	if err != nil {
		return fmt.Errorf("tls certificate %s: %w", k.certFile, err)
	}
	ks, err := StatStamp(k.keyFile)
	if err != nil {
		return fmt.Errorf("tls key %s: %w", k.keyFile, err)
	}
	pair, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("tls key pair %s, %s: %w", k.certFile, k.keyFile, err)
	}
	k.cur, k.stamps, k.checked = &pair, [2]FileStamp{cs, ks}, time.Now()
	return nil
}

// GetCertificate is tls.Config.GetCertificate: the current pair, read again
// first when the files changed since the last look.
func (k *KeyPairFile) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if time.Since(k.checked) < k.recheck {
		return k.cur, nil
	}
	k.checked = time.Now()
	cs, err1 := StatStamp(k.certFile)
	ks, err2 := StatStamp(k.keyFile)
	if err1 == nil && err2 == nil && [2]FileStamp{cs, ks} == k.stamps {
		return k.cur, nil
	}
	// load replaces the pair only when the new one loads.
	if err := k.load(); err != nil {
		k.log.Warn("tls key pair not reloaded; serving the previous one", zap.Error(err))
		return k.cur, nil
	}
	k.log.Info("tls key pair reloaded", zap.String("cert", k.certFile))
	return k.cur, nil
}

// TLSConfig is a server config serving this pair (TLS 1.2 and later).
func (k *KeyPairFile) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: k.GetCertificate}
}
