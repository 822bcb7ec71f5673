package xdsserver

import (
	"crypto/tls"
	"crypto/x509"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// TestFailClosedRootReload: the client asks Roots at every (re)connect, so
// a server presenting a certificate from a root the client did not trust
// at start is accepted once the roots in force change (XDS_ROOT_CA
// reloaded), and never fed before. (Issue 12 item 11; on 325f4ba the pool
// was fixed at NewClient.)
func TestFailClosedRootReload(t *testing.T) {
	pki := newTestPKI(t)
	stale := newTestPKI(t)
	var roots atomic.Pointer[x509.CertPool]
	roots.Store(stale.pool)
	srv := startServer(t, "127.0.0.1:0", grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pki.server}})))
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.1.0.1")}))
	srv.SetResources(xds.AuthorizationType, nil)
	c := startClient(t, srv.addr, func(cfg *xds.ClientConfig) {
		cfg.Insecure = false
		cfg.RootCAs = stale.pool // Roots wins
		cfg.Roots = roots.Load
	})
	testkit.Eventually(t, waitTimeout, "a failed handshake under the stale roots", func() bool {
		return counter(t, c.reg, "istio_xds_connection_terminations_total", "reason", xds.ReasonConnectionError) >= 2
	})
	if c.sink.callCount() != 0 {
		t.Fatal("sink was fed over an untrusted connection")
	}
	roots.Store(pki.pool)
	waitClosed(t, "Synced after the roots changed", c.Synced())
	if got := c.sink.names(xds.AddressType); len(got) != 1 || got[0] != "a" {
		t.Errorf("addresses = %v", got)
	}
}
