package telemetry

import (
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// TestPeerPrincipal: the access line's src.identity is always the peer
// certificate's URI; Source.Principal stands in only when it is that URI.
func TestPeerPrincipal(t *testing.T) {
	peer := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "client"}
	for _, tc := range []struct {
		source string
		peer   identity.Identity
	}{
		{"spiffe://cluster.local/ns/demo/sa/client", peer},
		{"", peer},
		{"spiffe://cluster.local/ns/demo/sa/other", peer},
		{"spiffe://cluster.local/ns/demo/sa/client/x", peer},
		{"spiffe://cluster.local/ns/demo/sa/client", identity.Identity{}},
	} {
		ex := &Entry{Peer: tc.peer, Source: Peer{Principal: tc.source}}
		if got, want := ex.peerPrincipal(), tc.peer.String(); got != want {
			t.Errorf("source %q, peer %v: %q, want %q", tc.source, tc.peer, got, want)
		}
	}
}
