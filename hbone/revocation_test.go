package hbone

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

var errFakeRevoked = errors.New("fake: certificate revoked")

// fakeRevocation revokes leaves by serial and records watched connections.
type fakeRevocation struct {
	mu      sync.Mutex
	revoked map[string]bool // serial (decimal)
	watched map[*fakeWatch]bool
	checks  int
}

type fakeWatch struct {
	chain   []*x509.Certificate
	peer    identity.Identity
	inbound bool
	revoke  func(error)
}

func newFakeRevocation() *fakeRevocation {
	return &fakeRevocation{revoked: map[string]bool{}, watched: map[*fakeWatch]bool{}}
}

func (f *fakeRevocation) CheckPeer(chain []*x509.Certificate, inbound bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checks++
	if f.revoked[chain[0].SerialNumber.String()] {
		return errFakeRevoked
	}
	return nil
}

func (f *fakeRevocation) WatchPeer(chain []*x509.Certificate, peer identity.Identity, inbound bool, revoke func(error)) func() {
	w := &fakeWatch{chain, peer, inbound, revoke}
	f.mu.Lock()
	f.watched[w] = true
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		delete(f.watched, w)
		f.mu.Unlock()
	}
}

// revoke lists c and closes the watched connections whose leaf is c, as a
// CRL reload does.
func (f *fakeRevocation) revoke(c *x509.Certificate) (closed []*fakeWatch) {
	f.mu.Lock()
	f.revoked[c.SerialNumber.String()] = true
	for w := range f.watched {
		if w.chain[0].SerialNumber.Cmp(c.SerialNumber) == 0 {
			delete(f.watched, w)
			closed = append(closed, w)
		}
	}
	f.mu.Unlock()
	for _, w := range closed {
		w.revoke(errFakeRevoked)
	}
	return closed
}

func (f *fakeRevocation) watching() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.watched)
}

func TestRevocationRefusesHandshake(t *testing.T) {
	m := newMesh(t)
	up := startUpstream(t, echo)
	srvRev, cliRev := newFakeRevocation(), newFakeRevocation()
	srv := startServer(t, m, dialHandler(), func(c *ServerConfig) { c.Revocation = srvRev })
	pool := func() *Pool {
		return newPool(t, m, func(c *PoolConfig) { c.Revocation = cliRev })
	}
	tun := mustConnect(t, pool(), connectReq(srv, up.addr))
	roundTrip(t, tun, "before")
	tun.Close()
	srvRev.mu.Lock()
	cliRev.mu.Lock()
	sc, cc := srvRev.checks, cliRev.checks
	cliRev.mu.Unlock()
	srvRev.mu.Unlock()
	if sc == 0 || cc == 0 {
		t.Fatalf("checks: server %d, client %d; want both asked", sc, cc)
	}

	t.Run("revoked client refused by the server", func(t *testing.T) {
		srvRev.mu.Lock()
		srvRev.revoked[m.client.Leaf.SerialNumber.String()] = true
		srvRev.mu.Unlock()
		defer func() {
			srvRev.mu.Lock()
			clear(srvRev.revoked)
			srvRev.mu.Unlock()
		}()
		_, err := pool().Connect(testCtx(t), connectReq(srv, up.addr))
		if !errors.Is(err, ErrHandshake) {
			t.Fatalf("Connect with a revoked client certificate: %v, want ErrHandshake", err)
		}
		waitFor(t, "the server's rejection line naming the revocation", func() bool {
			for _, e := range srv.logs.FilterMessage("hbone: rejected connection").All() {
				if err, ok := e.ContextMap()["error"].(string); ok && strings.Contains(err, errFakeRevoked.Error()) {
					return true
				}
			}
			return false
		})
	})
	t.Run("revoked server refused by the client", func(t *testing.T) {
		cliRev.mu.Lock()
		cliRev.revoked[m.server.Leaf.SerialNumber.String()] = true
		cliRev.mu.Unlock()
		defer func() {
			cliRev.mu.Lock()
			clear(cliRev.revoked)
			cliRev.mu.Unlock()
		}()
		_, err := pool().Connect(testCtx(t), connectReq(srv, up.addr))
		if !errors.Is(err, ErrHandshake) || !errors.Is(err, errFakeRevoked) {
			t.Fatalf("Connect to a revoked server: %v, want ErrHandshake wrapping the revocation", err)
		}
		checkErrText(t, err)
	})
}

func TestRevocationClosesEstablished(t *testing.T) {
	for _, side := range []string{"server revokes the client", "client revokes the server"} {
		t.Run(side, func(t *testing.T) {
			m := newMesh(t)
			up := startUpstream(t, echo)
			srvRev, cliRev := newFakeRevocation(), newFakeRevocation()
			ended := make(chan error, 1)
			h := HandlerFunc(func(ctx context.Context, req *Request) Reply {
				rep := dialHandler().ServeHBONE(ctx, req)
				rep.Done = func(_ TunnelStats, err error) { ended <- err }
				return rep
			})
			srv := startServer(t, m, h, func(c *ServerConfig) { c.Revocation = srvRev })
			p := newPool(t, m, func(c *PoolConfig) { c.Revocation = cliRev })
			tun := mustConnect(t, p, connectReq(srv, up.addr))
			defer tun.Close()
			roundTrip(t, tun, "open")
			waitFor(t, "both ends watched", func() bool { return srvRev.watching() == 1 && cliRev.watching() == 1 })

			var closed []*fakeWatch
			if side == "server revokes the client" {
				closed = srvRev.revoke(m.client.Leaf)
				if len(closed) != 1 || !closed[0].inbound || closed[0].peer != clientID {
					t.Fatalf("server closed %+v, want the inbound connection of %s", closed, clientID)
				}
			} else {
				closed = cliRev.revoke(m.server.Leaf)
				if len(closed) != 1 || closed[0].inbound || closed[0].peer != serverID {
					t.Fatalf("client closed %+v, want the outbound connection to %s", closed, serverID)
				}
			}
			// The open tunnel ends (not at EOF of the echo: it was never
			// half-closed), and the pool no longer uses the connection: a
			// new Connect handshakes again and is refused.
			buf := make([]byte, 1)
			if _, err := tun.Read(buf); err == nil || errors.Is(err, io.EOF) {
				t.Fatalf("read on a revoked connection: %v", err)
			}
			// The server's handler learns why its tunnel ended: the
			// revocation when it was the server's, a plain end otherwise.
			select {
			case err := <-ended:
				if side == "server revokes the client" && !errors.Is(err, errFakeRevoked) {
					t.Fatalf("server tunnel ended with %v, want the revocation", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the server's tunnel did not end")
			}
			if _, err := p.Connect(testCtx(t), connectReq(srv, up.addr)); !errors.Is(err, ErrHandshake) {
				t.Fatalf("Connect after the revocation: %v, want ErrHandshake", err)
			}
			waitFor(t, "no connection watched once they ended", func() bool {
				return srvRev.watching() == 0 && cliRev.watching() == 0
			})
		})
	}
}

func TestRevocationWatchEndsWithConnection(t *testing.T) {
	m := newMesh(t)
	up := startUpstream(t, echo)
	srvRev, cliRev := newFakeRevocation(), newFakeRevocation()
	srv := startServer(t, m, dialHandler(), func(c *ServerConfig) { c.Revocation = srvRev })
	p := newPool(t, m, func(c *PoolConfig) { c.Revocation = cliRev })
	tun := mustConnect(t, p, connectReq(srv, up.addr))
	roundTrip(t, tun, "x")
	tun.Close()
	p.Close()
	waitFor(t, "watches stopped after the pool closed its connection", func() bool {
		return srvRev.watching() == 0 && cliRev.watching() == 0
	})
}
