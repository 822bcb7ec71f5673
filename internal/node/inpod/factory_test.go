package inpod

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/proxy/route"

	"github.com/ztunnel-go/ztunnel-go/dnsproxy"
	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/proxy"
)

// listening reports whether something accepts TCP on 127.0.0.1:port inside
// ns (false on connection refused).
func listening(t *testing.T, ns *netnstest.NS, port uint16) bool {
	t.Helper()
	c, err := ns.Dial(context.Background(), "tcp", netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port), netns.SockOpts{})
	if errors.Is(err, syscall.ECONNREFUSED) {
		return false
	}
	if err != nil {
		t.Fatalf("dial %d in %s: %v", port, ns.Name, err)
	}
	c.Close()
	return true
}

func reopen(t *testing.T, ns *netnstest.NS) *netns.Handle {
	t.Helper()
	h, err := netns.Open("/var/run/netns/" + ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func newRealManager(t *testing.T) *Manager {
	t.Helper()
	store := state.NewStore()
	cfg := &config.Config{NodeName: "node0", TrustDomain: "cluster.local", PacketMark: 1337, InpodPortReuse: true,
		PoolMaxStreamsPerConn: 100, PoolUnusedRelease: time.Minute}
	f := &ProxyFactory{
		Proxy: &proxy.Deps{Store: store, Certs: identity.NewStaticSource(), Config: cfg},
		DNS:   &DNSTemplate{Deps: dnsproxy.Deps{Store: store}},
	}
	m, err := New(Config{DrainDeadline: time.Second}, Deps{Factory: f})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	return m
}

func podPorts() []uint16 {
	return []uint16{route.OutboundPort, route.InboundPlaintextPort, route.HBONEPort, dnsproxy.Port}
}

// Real pod proxies in real network namespaces: each pod gets its own
// 15001/15006/15008 and DNS listeners; a repeated add is idempotent;
// deleting one pod closes only its listeners.
func TestProxyFactoryInNetns(t *testing.T) {
	roottest.Require(t)
	a, b := netnstest.New(t, "a"), netnstest.New(t, "b")
	m := newRealManager(t)
	for _, p := range []struct {
		uid string
		ns  *netnstest.NS
	}{{"uid-a", a}, {"uid-b", b}, {"uid-a", a}} {
		if err := m.Add(p.uid, &zdsapi.WorkloadInfo{Name: p.uid, Namespace: "demo", ServiceAccount: "sa"}, reopen(t, p.ns)); err != nil {
			t.Fatalf("add %s: %v", p.uid, err)
		}
	}
	for _, ns := range []*netnstest.NS{a, b} {
		for _, p := range podPorts() {
			if !listening(t, ns, p) {
				t.Errorf("%s: nothing on %d", ns.Name, p)
			}
		}
	}
	if err := m.Del("uid-a"); err != nil {
		t.Fatal(err)
	}
	m.drains.Wait()
	for _, p := range podPorts() {
		if listening(t, a, p) {
			t.Errorf("pod a: %d still listening after Del", p)
		}
		if !listening(t, b, p) {
			t.Errorf("pod b: %d closed by pod a's Del", p)
		}
	}
}

// A pod whose port is taken (a socket without SO_REUSEPORT on 15001) cannot
// start: the add is refused and the pod stays pending until a retry
// succeeds.
func TestProxyFactoryBindConflictPending(t *testing.T) {
	roottest.Require(t)
	a := netnstest.New(t, "a")
	m := newRealManager(t)
	blocker, err := a.Listen(context.Background(), netip.MustParseAddrPort("0.0.0.0:15001"), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Add("uid-a", &zdsapi.WorkloadInfo{Name: "a", Namespace: "demo"}, reopen(t, a)); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("add with 15001 taken = %v, want EADDRINUSE", err)
	}
	if s := m.Dump().Pods["uid-a"].State; s != StatePending {
		t.Fatalf("state %s, want Pending", s)
	}
	blocker.Close()
	m.retryPending()
	if s := m.Dump().Pods["uid-a"].State; s != StateUp {
		t.Fatalf("state after retry %s, want Up", s)
	}
	for _, p := range podPorts() {
		if !listening(t, a, p) {
			t.Errorf("nothing on %d after the retry", p)
		}
	}
}
