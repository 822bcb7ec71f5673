package hbone

import (
	"crypto/x509"
	"errors"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// ErrRevoked is what a Revocation's errors wrap (errors.Is), so that the
// end of a connection it closed, or a refused handshake, can be told apart
// from other failures (the proxy records reason "revoked").
var ErrRevoked = errors.New("certificate revoked")

// Revocation is what HBONE asks about a peer beyond chain verification:
// whether a certificate of its chain is revoked now (in the handshake) and
// later (for as long as the connection lives). The node proxy passes its
// CRL manager (internal/node/crl.Manager); nil in ServerConfig and
// ClientConfig means no revocation checks.
type Revocation interface {
	// CheckPeer returns an error, which refuses the handshake, when a
	// certificate of chain (leaf first, as the peer presented it, already
	// verified against the trust bundle) is revoked. inbound: the peer is a
	// client of our server; else the server we dialled.
	CheckPeer(chain []*x509.Certificate, inbound bool) error
	// WatchPeer registers an established connection: revoke, called at
	// most once and from another goroutine, closes it with the error that
	// says why. stop is called when the connection has ended.
	WatchPeer(chain []*x509.Certificate, peer identity.Identity, inbound bool, revoke func(error)) (stop func())
}

// checkRevoked runs rev's handshake check; nil rev checks nothing.
func checkRevoked(rev Revocation, chain []*x509.Certificate, inbound bool) error {
	if rev == nil {
		return nil
	}
	return rev.CheckPeer(chain, inbound)
}

// watchRevoked registers c with rev until c ends; revocation fails c with
// rev's error (abruptly: every tunnel on it ends). nil rev: nothing.
func watchRevoked(rev Revocation, c *conn, chain []*x509.Certificate, inbound bool) (stop func()) {
	if rev == nil {
		return func() {}
	}
	return rev.WatchPeer(chain, c.peer, inbound, c.fail)
}
