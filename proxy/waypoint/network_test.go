package waypoint

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// TestUpstreamThroughNetworkGateway: a service bound to the waypoint whose
// only endpoint is on another network (Istio 1.27+): the waypoint opens the
// outer CONNECT to the endpoint's network gateway for the service's
// hostname and, inside it, its own mTLS connection to the endpoint, which
// sees the waypoint's identity and x-forwarded-network.
func TestUpstreamThroughNetworkGateway(t *testing.T) {
	const (
		gwIP      = "127.77.0.31"
		eastIP    = "127.77.0.32" // the remote node proxy, reached only through the gateway
		remoteVIP = "10.77.0.5"
	)
	cfg := baseConfig()
	cfg.Services = append(cfg.Services, &waypointapi.Service{
		Name: "remote", Namespace: "demo", Hostname: proxytest.Hostname("demo", "remote"), Kind: "Service",
		Addresses: [][]byte{netip.MustParseAddr(remoteVIP).AsSlice()},
		Ports:     []*waypointapi.Port{{Port: 80, Name: "http", Protocol: waypointapi.Protocol_HTTP}},
	})
	l := newLab(t, cfg)
	gwID := identity.MustNew("cluster.local", "istio-system", "sa-ew")
	eastID := identity.MustNew("cluster.local", "demo", "sa-east")
	for _, id := range []identity.Identity{gwID, eastID} {
		wc, err := l.ca.Issue(id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		l.certs.Set(wc)
	}
	var mu sync.Mutex
	var outer, inner []*hbone.Request
	serve := func(ip string, id identity.Identity, record *[]*hbone.Request, upstream string) {
		srv, err := hbone.NewServer(hbone.ServerConfig{Identity: id, Certs: l.certs, AcceptHostnames: true,
			Handler: hbone.HandlerFunc(func(ctx context.Context, req *hbone.Request) hbone.Reply {
				mu.Lock()
				*record = append(*record, req)
				mu.Unlock()
				var d net.Dialer
				up, err := d.DialContext(ctx, "tcp", upstream)
				if err != nil {
					return hbone.Reply{Status: 503}
				}
				return hbone.Reply{Upstream: up}
			})})
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(listen(t, ip+":15008"))
		t.Cleanup(func() { srv.Close() })
	}
	serve(gwIP, gwID, &outer, eastIP+":15008")  // forwards the inner stream unread
	serve(eastIP, eastID, &inner, v1IP+":8080") // the remote pod's app is v1's
	proxytest.Apply(t, l.w.sink.Store,
		proxytest.Pod("istio-system", "ew", gwIP, proxytest.Network("east"), proxytest.ServiceAccount("sa-ew")),
		proxytest.Pod("demo", "server-east", "", proxytest.Network("east"), proxytest.ServiceAccount("sa-east"),
			proxytest.NetworkGateway(proxytest.GatewayIP("east", gwIP, 15008)),
			proxytest.InService(proxytest.ServiceKey("demo", "remote"), 80, 8080)),
		proxytest.Service("demo", "remote", remoteVIP, []uint32{80, 8080}, proxytest.ServiceWaypoint(proxytest.WaypointIP(wpIP))),
	)

	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return l.tunnel(ctx, clientID, clientIP, remoteVIP+":80")
		},
	}}
	code, body := get(t, c, "/across")
	if code != 200 || !strings.HasPrefix(body, "v1 GET /across") {
		t.Fatalf("GET through the gateway = %d %q, want 200 from the remote pod", code, body)
	}
	mu.Lock()
	defer mu.Unlock()
	host := proxytest.Hostname("demo", "remote")
	if len(outer) != 1 || outer[0].Host != host || outer[0].Authority.Port() != 80 || outer[0].Peer != wpID || outer[0].HasForwardedNetwork {
		t.Errorf("gateway saw %+v, want one CONNECT %s:80 from the waypoint without x-forwarded-network", outer, host)
	}
	if len(inner) != 1 || inner[0].Host != host || inner[0].Peer != wpID || !inner[0].HasForwardedNetwork {
		t.Errorf("remote node proxy saw %+v, want one CONNECT %s:80 with the waypoint's identity and x-forwarded-network", inner, host)
	}
}
