package proxy

import (
	"io"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestConnectionsListsOpened: a connection is listed exactly between
// Opened and Record, with its peers, identities and live byte counts; the
// snapshot is safe beside connections opening and closing (run with -race).
func TestConnectionsListsOpened(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	if got := (*Metrics)(nil).Connections(); got != nil {
		t.Errorf("nil metrics: %v", got)
	}
	src, dst := netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("10.0.1.1:15008")
	r := NewResult(m, nil, Outbound, src, dst)
	r.Src = Peer{Workload: "client", Namespace: "demo", Identity: identity.MustNew("cluster.local", "demo", "sa-client")}
	r.Dst = Peer{Workload: "server", Namespace: "demo", Identity: identity.MustNew("cluster.local", "demo", "sa-server")}
	r.Service, r.MTLS, r.HBONEAddr = Service{Hostname: "echo.demo.svc.cluster.local"}, true, netip.MustParseAddrPort("10.0.1.1:8080")
	if n := len(m.Connections()); n != 0 {
		t.Fatalf("listed before Opened: %d", n)
	}
	r.Counters.SetProbe(func() (int64, int64) { return 5, 7 })
	r.Opened()
	r.Counters.Sent.Store(3)
	got := m.Connections()
	if len(got) != 1 {
		t.Fatalf("got %d connections, want 1", len(got))
	}
	c := got[0]
	want := Connection{Direction: "outbound", Start: r.Start,
		Src:       ConnPeer{Addr: "10.0.0.1:40000", Workload: "client", Namespace: "demo", Identity: "spiffe://cluster.local/ns/demo/sa/sa-client"},
		Dst:       ConnPeer{Addr: "10.0.1.1:15008", Workload: "server", Namespace: "demo", Identity: "spiffe://cluster.local/ns/demo/sa/sa-server"},
		HBONEAddr: "10.0.1.1:8080", Service: "echo.demo.svc.cluster.local", MTLS: true, BytesSent: 5, BytesReceived: 7}
	if c != want {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}

	// Plaintext inbound: no source identity is claimed.
	r2 := NewResult(m, nil, Inbound, netip.MustParseAddrPort("10.0.2.1:5000"), netip.MustParseAddrPort("10.0.0.1:8080"))
	r2.Opened()
	if got := m.Connections(); len(got) != 2 || got[1].Src.Identity != "" || got[1].Direction != "inbound" || got[0].Start.After(got[1].Start) {
		t.Errorf("two connections, oldest first: %+v", got)
	}
	var err error
	r.Record(&err)
	r2.Record(&err)
	if n := len(m.Connections()); n != 0 {
		t.Errorf("listed after Record: %d", n)
	}

	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				_ = m.Connections()
			}
		}
	})
	for i := range 200 {
		r := NewResult(m, nil, Outbound, netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(1000+i)), dst)
		r.Opened()
		r.Counters.Sent.Add(int64(i))
		r.Record(&err)
	}
	close(stop)
	wg.Wait()
}

// TestConnectionsLiveTunnel: an inbound HBONE tunnel through a real pod
// proxy is listed while open with the peer's proven identity and the bytes
// it carried, and is gone once it ends (root: a network namespace).
func TestConnectionsLiveTunnel(t *testing.T) {
	e := newPodEnv(t)
	tun, err := e.connect(t, "10.55.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := tun.Read(buf); err != nil {
		t.Fatal(err)
	}
	io.WriteString(tun, "0123456789")
	if _, err := io.ReadFull(tun, buf[:10]); err != nil {
		t.Fatal(err)
	}
	m := e.proxy.d.Metrics
	testkit.Eventually(t, 5*time.Second, "the tunnel listed with its bytes", func() bool {
		cs := m.Connections()
		return len(cs) == 1 && cs[0].Direction == "inbound" && cs[0].Src.Identity == "spiffe://cluster.local/ns/apps/sa/peer" &&
			cs[0].Dst.Identity == e.id.String() && cs[0].HBONEAddr == "10.55.0.1:8080" && cs[0].MTLS && cs[0].BytesSent >= 10
	})
	tun.CloseWrite()
	io.Copy(io.Discard, tun)
	testkit.Eventually(t, 5*time.Second, "the tunnel gone", func() bool { return len(m.Connections()) == 0 })
}
