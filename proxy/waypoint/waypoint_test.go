package waypoint

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry"
)

// The loopback mesh of these tests: every "pod" is a distinct 127.77.0.x
// address; the waypoint, the two backend pods (each with an HBONE server
// standing in for its node proxy) and the clients run in this process.
const (
	wpIP      = "127.77.0.1"
	v1IP      = "127.77.0.11"
	v2IP      = "127.77.0.12"
	clientIP  = "127.77.0.21"
	client2IP = "127.77.0.22"
	svcVIP    = "10.77.0.1"
	v1VIP     = "10.77.0.2"
	v2VIP     = "10.77.0.3"
	otherVIP  = "10.77.0.9"
)

var (
	wpID      = identity.MustNew("cluster.local", "demo", "waypoint")
	clientID  = identity.MustNew("cluster.local", "demo", "sa-client")
	client2ID = identity.MustNew("cluster.local", "other", "sa-client2")
)

type lab struct {
	t       testing.TB
	w       *Waypoint
	reg     *prometheus.Registry
	certs   *identity.StaticSource
	pools   map[identity.Identity]*hbone.Pool
	ca      *ca.CA       // issues further identities
	fail503 atomic.Int64 // backend v1 answers 503 this many more times
	hits    [2]atomic.Int64
	last    [2]atomic.Pointer[string] // each backend's last HTTP request: "host body"
	// lastTraceparent is the traceparent of the last CONNECT a backend's
	// node proxy accepted.
	lastTraceparent atomic.Pointer[string]
}

func dialFrom(src netip.Addr) hbone.DialFunc {
	return func(ctx context.Context, _ netip.Addr, hop netip.AddrPort) (net.Conn, error) {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
		return d.DialContext(ctx, "tcp", hop.String())
	}
}

func listen(t testing.TB, ap string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", ap)
	if err != nil {
		t.Skipf("cannot listen on %s (loopback aliases needed): %v", ap, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// startBackend runs pod ip: an HTTP app on :8080 (h2c too), a TCP echo on
// :9000 and an HBONE server on :15008 that connects CONNECTs to them.
func (l *lab) startBackend(ip string, id identity.Identity, n int) {
	t := l.t
	// A gRPC server on the same port (h2c), with the health service: each
	// backend reports SERVING for its own name ("v1", "v2") only, so a
	// caller can tell which one answered.
	gs := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus(fmt.Sprintf("v%d", n+1), healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	t.Cleanup(gs.Stop)
	app := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && telemetry.IsGRPC(r.Header.Get("content-type")) {
			l.hits[n].Add(1)
			gs.ServeHTTP(rw, r)
			return
		}
		if n == 0 && l.fail503.Add(-1) >= 0 {
			http.Error(rw, "try again", http.StatusServiceUnavailable)
			return
		}
		l.hits[n].Add(1)
		reqBody, _ := io.ReadAll(r.Body)
		last := r.Host + " " + string(reqBody)
		l.last[n].Store(&last)
		rw.Header().Set("x-backend", fmt.Sprintf("v%d", n+1))
		fmt.Fprintf(rw, "v%d %s %s xff=%s route=%s drop=%q proto=%d", n+1, r.Method, r.URL.Path,
			r.Header.Get("X-Forwarded-For"), r.Header.Get("x-route"), r.Header.Get("x-drop"), r.ProtoMajor)
	})}
	app.Protocols = new(http.Protocols)
	app.Protocols.SetHTTP1(true)
	app.Protocols.SetUnencryptedHTTP2(true)
	go app.Serve(listen(t, ip+":8080"))
	t.Cleanup(func() { app.Close() })
	echo := listen(t, ip+":9000")
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	srv, err := hbone.NewServer(hbone.ServerConfig{Identity: id, Certs: l.certs, Handler: hbone.HandlerFunc(
		func(ctx context.Context, req *hbone.Request) hbone.Reply {
			if req.Peer != wpID {
				return hbone.Reply{Status: 401} // only the waypoint may come here
			}
			tp := req.Traceparent
			l.lastTraceparent.Store(&tp)
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", req.Authority.String())
			if err != nil {
				return hbone.Reply{Status: 503}
			}
			return hbone.Reply{Status: 200, Upstream: c}
		})})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(listen(t, ip+":15008"))
	t.Cleanup(func() { srv.Close() })
}

func newLab(t *testing.T, cfg *waypointapi.Config) *lab { return newLabWith(t, cfg, labOptions{}) }

// labOptions change what newLabWith builds: the CA's root (ca.Options) and
// the waypoint's revocation checks, inbound and on its upstream pool.
type labOptions struct {
	ca         ca.Options
	revocation hbone.Revocation
	configure  func(*Waypoint) // runs before the waypoint serves (test knobs)
}

func newLabWith(t testing.TB, cfg *waypointapi.Config, o labOptions) *lab {
	authority, err := ca.New(o.ca)
	if err != nil {
		t.Fatal(err)
	}
	l := &lab{t: t, reg: prometheus.NewRegistry(), pools: map[identity.Identity]*hbone.Pool{}, ca: authority}
	var wcs []*identity.WorkloadCertificate
	v1ID, v2ID := identity.MustNew("cluster.local", "demo", "sa-v1"), identity.MustNew("cluster.local", "demo", "sa-v2")
	for _, id := range []identity.Identity{wpID, clientID, client2ID, v1ID, v2ID} {
		wc, err := authority.Issue(id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		wcs = append(wcs, wc)
	}
	l.certs = identity.NewStaticSource(wcs...)
	l.startBackend(v1IP, v1ID, 0)
	l.startBackend(v2IP, v2ID, 1)

	pool, err := hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: l.certs, Dial: dialFrom(netip.MustParseAddr(wpIP)),
		Revocation: o.revocation}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	l.w, err = New(Options{Name: "demo/waypoint", Identity: wpID, IP: netip.MustParseAddr(wpIP), Certs: l.certs, Pool: pool, Registerer: l.reg,
		Revocation: o.revocation})
	if err != nil {
		t.Fatal(err)
	}
	wp := proxytest.WaypointIP(wpIP)
	proxytest.Apply(t, l.w.sink.Store,
		proxytest.Pod("demo", "waypoint", wpIP, proxytest.ServiceAccount("waypoint")),
		proxytest.Pod("demo", "server-v1", v1IP, proxytest.ServiceAccount("sa-v1"),
			proxytest.InService(proxytest.ServiceKey("demo", "server"), 80, 8080, 9000, 9000),
			proxytest.InService(proxytest.ServiceKey("demo", "server-v1"), 80, 8080)),
		proxytest.Pod("demo", "server-v2", v2IP, proxytest.ServiceAccount("sa-v2"),
			proxytest.InService(proxytest.ServiceKey("demo", "server-v2"), 80, 8080)),
		proxytest.Pod("demo", "client", clientIP, proxytest.ServiceAccount("sa-client")),
		proxytest.Service("demo", "server", svcVIP, []uint32{80, 8080, 9000, 9000}, proxytest.ServiceWaypoint(wp)),
		proxytest.Service("demo", "server-v1", v1VIP, []uint32{80, 8080}),
		proxytest.Service("demo", "server-v2", v2VIP, []uint32{80, 8080}),
		proxytest.Service("demo", "other", otherVIP, []uint32{80, 8080}),
	)
	l.setConfig(cfg)
	if o.configure != nil {
		o.configure(l.w)
	}
	go l.w.Serve(listen(t, wpIP+":15008"))
	t.Cleanup(func() { l.w.Close() })
	return l
}

func (l *lab) setConfig(cfg *waypointapi.Config) {
	l.t.Helper()
	if err := l.w.sink.ApplyWaypoints(map[string]*waypointapi.Config{"demo/waypoint": cfg}, nil); err != nil {
		l.t.Fatal(err)
	}
}

func baseConfig(policies ...*waypointapi.Policy) *waypointapi.Config {
	return &waypointapi.Config{
		Name: "waypoint", Namespace: "demo", Identity: wpID.String(),
		Services: []*waypointapi.Service{{
			Name: "server", Namespace: "demo", Hostname: proxytest.Hostname("demo", "server"), Kind: "Service",
			Addresses: [][]byte{netip.MustParseAddr(svcVIP).AsSlice()},
			Ports:     []*waypointapi.Port{{Port: 80, Name: "http", Protocol: waypointapi.Protocol_HTTP}, {Port: 9000, Name: "tcp"}},
		}},
		Policies: policies,
	}
}

// tunnel opens a CONNECT as id from ip to the waypoint for authority.
func (l *lab) tunnel(ctx context.Context, id identity.Identity, ip, authority string) (net.Conn, error) {
	p := l.pools[id]
	if p == nil {
		var err error
		p, err = hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: l.certs, Dial: dialFrom(netip.MustParseAddr(ip))}})
		if err != nil {
			l.t.Fatal(err)
		}
		l.pools[id] = p
		l.t.Cleanup(func() { p.Close() })
	}
	return p.Connect(ctx, &hbone.ConnectRequest{
		Key:       hbone.Key{Src: id, Dst: []identity.Identity{wpID}, SrcIP: netip.MustParseAddr(ip), NextHop: netip.MustParseAddrPort(wpIP + ":15008")},
		Authority: netip.MustParseAddrPort(authority),
	})
}

// client is an HTTP/1.1 client whose connections are tunnels to svcVIP:80.
func (l *lab) client(id identity.Identity, ip string) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return l.tunnel(ctx, id, ip, svcVIP+":80") },
	}}
}

func get(t *testing.T, c *http.Client, path string, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://server.demo.svc.cluster.local"+path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func exact(s string) *waypointapi.StringMatch {
	return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Exact{Exact: s}}
}

func prefix(s string) *waypointapi.StringMatch {
	return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Prefix{Prefix: s}}
}

func TestL7DenyPath(t *testing.T) {
	l := newLab(t, baseConfig(&waypointapi.Policy{
		Name: "deny-admin", Namespace: "demo", Action: waypointapi.Action_DENY,
		Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{prefix("/admin")}}}}},
	}))
	c := l.client(clientID, clientIP)
	if code, body := get(t, c, "/admin/users"); code != 403 || body != DeniedBody {
		t.Errorf("GET /admin/users = %d %q, want 403 %q", code, body, DeniedBody)
	}
	code, body := get(t, c, "/ok")
	if code != 200 || !strings.HasPrefix(body, "v1 GET /ok xff="+clientIP) {
		t.Errorf("GET /ok = %d %q, want 200 from v1 with X-Forwarded-For %s", code, body, clientIP)
	}
	// Stats is the last step, after the response went out: poll.
	count := func(codeLabel string) float64 {
		got := 0.0
		mfs, _ := l.reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "istio_requests_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				lab := map[string]string{}
				for _, lp := range m.GetLabel() {
					lab[lp.GetName()] = lp.GetValue()
				}
				if lab["reporter"] == "waypoint" && lab["response_code"] == codeLabel && lab["source_principal"] == "spiffe://cluster.local/ns/demo/sa/sa-client" &&
					lab["destination_service"] == "server.demo.svc.cluster.local" &&
					(codeLabel == "403") == (lab["destination_workload"] == "unknown") {
					got += m.GetCounter().GetValue()
				}
			}
		}
		return got
	}
	for _, codeLabel := range []string{"403", "200"} {
		testkit.Eventually(t, 2*time.Second, "istio_requests_total{reporter=waypoint,response_code="+codeLabel+"} = 1",
			func() bool { return count(codeLabel) == 1 })
	}
	if n := testutil.CollectAndCount(l.reg, "istio_request_duration_milliseconds"); n == 0 {
		t.Error("no istio_request_duration_milliseconds series")
	}
}

// TestClassDefaultDenyGatewayAllow: an ALLOW without rules (GatewayClass
// baseline: deny all) plus a per-Gateway ALLOW for one principal and GET.
func TestClassDefaultDenyGatewayAllow(t *testing.T) {
	l := newLab(t, baseConfig(
		&waypointapi.Policy{Name: "baseline", Namespace: "istio-system", Action: waypointapi.Action_ALLOW, Target: "GatewayClass istio-waypoint"},
		&waypointapi.Policy{Name: "allow-client", Namespace: "demo", Action: waypointapi.Action_ALLOW, Rules: []*waypointapi.Rule{{
			From: []*waypointapi.Source{{Principals: []*waypointapi.StringMatch{exact("cluster.local/ns/demo/sa/sa-client")}}},
			To:   []*waypointapi.Operation{{Methods: []*waypointapi.StringMatch{exact("GET")}}},
			When: []*waypointapi.Condition{{Key: "request.headers[x-team]", NotValues: []*waypointapi.StringMatch{exact("banned")}}},
		}}},
	))
	if code, _ := get(t, l.client(clientID, clientIP), "/x"); code != 200 {
		t.Errorf("allowed client: %d, want 200", code)
	}
	if code, body := get(t, l.client(clientID, clientIP), "/x", "x-team", "banned"); code != 403 || body != DeniedBody {
		t.Errorf("allowed client with a banned header: %d %q, want 403", code, body)
	}
	if code, _ := get(t, l.client(client2ID, client2IP), "/x"); code != 403 {
		t.Errorf("other client: %d, want 403 (baseline denies)", code)
	}
	// The same policies without the per-Gateway ALLOW: everything denied.
	l.setConfig(baseConfig(&waypointapi.Policy{Name: "baseline", Namespace: "istio-system", Action: waypointapi.Action_ALLOW}))
	if code, _ := get(t, l.client(clientID, clientIP), "/x"); code != 403 {
		t.Errorf("after removing the ALLOW: %d, want 403", code)
	}
}

func weightedRoute() *waypointapi.Route {
	return &waypointapi.Route{Name: "split", Namespace: "demo", Rules: []*waypointapi.RouteRule{
		{
			Matches:                []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_PATH_PREFIX, Value: "/api"}}},
			RequestHeaderModifiers: []*waypointapi.HeaderModifier{{Set: map[string]string{"x-route": "split"}, Remove: []string{"x-drop"}}},
			Backends: []*waypointapi.Backend{
				{Hostname: proxytest.Hostname("demo", "server-v1"), Namespace: "demo", Port: 80, Weight: 90},
				{Hostname: proxytest.Hostname("demo", "server-v2"), Namespace: "demo", Port: 80, Weight: 10},
			},
		},
		{
			Matches:  []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_EXACT, Value: "/api/v2"}, Method: "GET"}},
			Backends: []*waypointapi.Backend{{Hostname: proxytest.Hostname("demo", "server-v2"), Namespace: "demo", Port: 80, Weight: 1}},
		},
		{
			Matches:  []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Value: "/retry"}}},
			Backends: []*waypointapi.Backend{{Hostname: proxytest.Hostname("demo", "server-v1"), Namespace: "demo", Port: 80, Weight: 1}},
			Retry:    &waypointapi.Retry{Attempts: 2},
		},
	}}
}

func TestWeightedRouting(t *testing.T) {
	cfg := baseConfig()
	cfg.Services[0].Routes = []*waypointapi.Route{weightedRoute()}
	l := newLab(t, cfg)
	c := l.client(clientID, clientIP)
	const n = 1000
	for i := 0; i < n; i++ {
		if code, body := get(t, c, "/api/items", "x-drop", "1"); code != 200 || !strings.Contains(body, "route=split drop=\"\"") {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	v1 := float64(l.hits[0].Load()) / n
	t.Logf("v1 %.3f v2 %.3f over %d requests", v1, 1-v1, n)
	if v1 < 0.87 || v1 > 0.93 {
		t.Errorf("v1 share %.3f, want 0.90 ± 0.03", v1)
	}
	// The exact match wins over the prefix.
	if code, body := get(t, c, "/api/v2"); code != 200 || !strings.HasPrefix(body, "v2 ") {
		t.Errorf("GET /api/v2 = %d %q, want v2", code, body)
	}
	// No rule matches: 404.
	if code, _ := get(t, c, "/nothing"); code != 404 {
		t.Errorf("GET /nothing = %d, want 404", code)
	}
	// Retry on 503: two 503s, then success within attempts.
	l.fail503.Store(2)
	if code, body := get(t, c, "/retry"); code != 200 || !strings.HasPrefix(body, "v1 ") {
		t.Errorf("GET /retry after two 503s = %d %q, want 200", code, body)
	}
	l.fail503.Store(3)
	if code, _ := get(t, c, "/retry"); code != 503 {
		t.Errorf("GET /retry after three 503s = %d, want 503 (attempts exhausted)", code)
	}
	l.fail503.Store(0)
}

// TestH2C: HTTP/2 with prior knowledge inside the tunnel.
func TestH2C(t *testing.T) {
	l := newLab(t, baseConfig(&waypointapi.Policy{
		Name: "deny-admin", Namespace: "demo", Action: waypointapi.Action_DENY,
		Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{prefix("/admin")}}}}},
	}))
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http2.Transport{AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
			return l.tunnel(ctx, clientID, clientIP, svcVIP+":80")
		}}}
	if code, body := get(t, c, "/ok"); code != 200 || !strings.HasPrefix(body, "v1 GET /ok") {
		t.Errorf("h2c GET /ok = %d %q", code, body)
	}
	if code, body := get(t, c, "/admin"); code != 403 || body != DeniedBody {
		t.Errorf("h2c GET /admin = %d %q", code, body)
	}
}

// TestTCPFallback: a port without an HTTP protocol is spliced as TCP; L4
// rules apply and HTTP-only rules never allow it.
func TestTCPFallback(t *testing.T) {
	l := newLab(t, baseConfig(&waypointapi.Policy{
		Name: "allow-get", Namespace: "demo", Action: waypointapi.Action_ALLOW,
		Rules: []*waypointapi.Rule{
			{To: []*waypointapi.Operation{{Methods: []*waypointapi.StringMatch{exact("GET")}}}},
			{From: []*waypointapi.Source{{Namespaces: []*waypointapi.StringMatch{exact("demo")}}}, To: []*waypointapi.Operation{{Ports: []uint32{9000}}}},
		},
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := l.tunnel(ctx, clientID, clientIP, svcVIP+":9000")
	if err != nil {
		t.Fatalf("tunnel to the TCP port: %v", err)
	}
	defer c.Close()
	fmt.Fprintf(c, "hello\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "hello\n" {
		t.Errorf("echo = %q, %v", line, err)
	}
	// client2 (namespace other) only has the GET rule, which never matches TCP.
	_, err = l.tunnel(ctx, client2ID, client2IP, svcVIP+":9000")
	var se *hbone.StatusError
	if !errors.As(err, &se) || se.Code != 403 {
		t.Errorf("client2 on TCP: %v, want a 403 refusal", err)
	}
}

// TestNotAnOpenRelay: a CONNECT to a service or address not bound to the
// waypoint is refused.
func TestNotAnOpenRelay(t *testing.T) {
	l := newLab(t, baseConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, dst := range []string{otherVIP + ":80", v1IP + ":8080", svcVIP + ":81"} {
		_, err := l.tunnel(ctx, clientID, clientIP, dst)
		var se *hbone.StatusError
		if !errors.As(err, &se) || (se.Code != 403 && se.Code != 503) {
			t.Errorf("CONNECT %s: %v, want refused", dst, err)
		}
	}
}

// TestFilterOrder: authorization runs before routing (a denied request to a
// path no route matches is 403, not 404), and dry-run policies never deny.
func TestFilterOrder(t *testing.T) {
	cfg := baseConfig(
		&waypointapi.Policy{Name: "deny-secret", Namespace: "demo", Action: waypointapi.Action_DENY,
			Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{{MatchType: &waypointapi.StringMatch_Suffix{Suffix: ".secret"}}}}}}}},
		&waypointapi.Policy{Name: "dry-deny-all", Namespace: "demo", Action: waypointapi.Action_DENY, DryRun: true, Rules: []*waypointapi.Rule{{}}},
	)
	cfg.Services[0].Routes = []*waypointapi.Route{weightedRoute()}
	l := newLab(t, cfg)
	c := l.client(clientID, clientIP)
	if code, body := get(t, c, "/nothing/x.secret"); code != 403 || body != DeniedBody {
		t.Errorf("denied unrouted path = %d %q, want 403", code, body)
	}
	if code, _ := get(t, c, "/nothing"); code != 404 {
		t.Errorf("allowed unrouted path = %d, want 404", code)
	}
	if code, _ := get(t, c, "/api/x"); code != 200 {
		t.Errorf("routed path under a dry-run deny-all = %d, want 200", code)
	}
}

// TestRequestResponseBytes: istio_request_bytes and istio_response_bytes
// hold each request's size (request line, headers, body) and its
// response's, and the access log carries both.
func TestRequestResponseBytes(t *testing.T) {
	l := newLab(t, baseConfig())
	c := l.client(clientID, clientIP)
	body := strings.Repeat("x", 5000)
	req, _ := http.NewRequest(http.MethodPost, "http://server.demo.svc.cluster.local/ok", strings.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST /ok = %d %q", resp.StatusCode, answer)
	}
	sum := func(name string) (float64, uint64) {
		mfs, _ := l.reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "response_code" && lp.GetValue() == "200" {
						return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
					}
				}
			}
		}
		return 0, 0
	}
	testkit.Eventually(t, 2*time.Second, "one istio_request_bytes sample", func() bool { _, n := sum("istio_request_bytes"); return n == 1 })
	if s, _ := sum("istio_request_bytes"); s < 5000 || s > 5000+1024 {
		t.Errorf("istio_request_bytes sum = %v, want the 5000-byte body plus its request line and headers", s)
	}
	if s, n := sum("istio_response_bytes"); n != 1 || s < float64(len(answer)) || s > float64(len(answer))+1024 {
		t.Errorf("istio_response_bytes = %v over %d samples, want the %d-byte body plus its status line and headers", s, n, len(answer))
	}
}

// TestGRPC: a real gRPC client (grpc-go, h2c in the tunnel) through the
// waypoint to a real gRPC server: a route on the method path (as a
// GRPCRoute method match is translated) sends Check to v2, a DENY on the
// Watch method answers PERMISSION_DENIED, and the request is counted with
// request_protocol="grpc".
func TestGRPC(t *testing.T) {
	cfg := baseConfig(&waypointapi.Policy{
		Name: "deny-watch", Namespace: "demo", Action: waypointapi.Action_DENY,
		Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{exact("/grpc.health.v1.Health/Watch")}}}}},
	})
	cfg.Services[0].Routes = []*waypointapi.Route{{Name: "health", Namespace: "demo", Rules: []*waypointapi.RouteRule{
		{
			Matches:  []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Type: waypointapi.PathMatch_EXACT, Value: "/grpc.health.v1.Health/Check"}}},
			Backends: []*waypointapi.Backend{{Hostname: proxytest.Hostname("demo", "server-v2"), Namespace: "demo", Port: 80, Weight: 1}},
		},
		{Backends: []*waypointapi.Backend{{Hostname: proxytest.Hostname("demo", "server-v1"), Namespace: "demo", Port: 80, Weight: 1}}},
	}}}
	l := newLab(t, cfg)
	cc, err := grpc.NewClient("passthrough:///server.demo.svc.cluster.local:80",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return l.tunnel(ctx, clientID, clientIP, svcVIP+":80")
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(cc)
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "v2"})
	if err != nil {
		t.Fatalf("Check(v2) through the waypoint: %v", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING || l.hits[1].Load() != 1 {
		t.Errorf("Check(v2) = %v with %d v2 hits: the method route did not pick v2", resp.GetStatus(), l.hits[1].Load())
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "v1"})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("Watch under a DENY on its method: %v, want PermissionDenied", err)
	}
	grpcRequests := func() float64 {
		got := 0.0
		mfs, _ := l.reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "istio_requests_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "request_protocol" && lp.GetValue() == "grpc" {
						got += m.GetCounter().GetValue()
					}
				}
			}
		}
		return got
	}
	testkit.Eventually(t, 2*time.Second, `istio_requests_total{request_protocol="grpc"} = 2`, func() bool { return grpcRequests() == 2 })
	// grpc_response_status: OK from the trailers of Check, PERMISSION_DENIED
	// (7) from the waypoint's trailers-only refusal of Watch.
	for code, want := range map[string]float64{"0": 1, "7": 1} {
		if got := l.metric(t, "istio_requests_total", "request_protocol", "grpc", "grpc_response_status", code); got != want {
			t.Errorf(`istio_requests_total{grpc_response_status=%q} = %v, want %v`, code, got, want)
		}
	}
}

// TestMirror: a rule's RequestMirror sends a copy of each request (body
// included, Host with "-shadow") to the mirror backend and the client gets
// the routed backend's answer; a body of unknown length is not mirrored.
func TestMirror(t *testing.T) {
	cfg := baseConfig()
	cfg.Services[0].Routes = []*waypointapi.Route{{Name: "mirrored", Namespace: "demo", Rules: []*waypointapi.RouteRule{{
		Backends: []*waypointapi.Backend{{Hostname: proxytest.Hostname("demo", "server-v1"), Namespace: "demo", Port: 80, Weight: 1}},
		Mirrors:  []*waypointapi.Mirror{{Backend: &waypointapi.Backend{Hostname: proxytest.Hostname("demo", "server-v2"), Namespace: "demo", Port: 80}, Percent: 100}},
	}}}}
	l := newLab(t, cfg)
	c := l.client(clientID, clientIP)
	req, _ := http.NewRequest(http.MethodPost, "http://server.demo.svc.cluster.local/orders", strings.NewReader("order-42"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(answer), "v1 POST /orders") {
		t.Fatalf("POST /orders = %d %q, want v1's answer", resp.StatusCode, answer)
	}
	if got := *l.last[0].Load(); got != "server.demo.svc.cluster.local order-42" {
		t.Errorf("v1 got %q", got)
	}
	testkit.Eventually(t, 3*time.Second, "the mirror at v2", func() bool { return l.hits[1].Load() == 1 })
	if got := *l.last[1].Load(); got != "server.demo.svc.cluster.local-shadow order-42" {
		t.Errorf("mirror at v2 got %q, want the shadow host and the same body", got)
	}
	// Unknown length (chunked): routed, not mirrored.
	req, _ = http.NewRequest(http.MethodPost, "http://server.demo.svc.cluster.local/orders", io.MultiReader(strings.NewReader("chunked")))
	if code, body := do(t, c, req); code != 200 || !strings.HasPrefix(body, "v1 POST") {
		t.Fatalf("chunked POST = %d %q", code, body)
	}
	time.Sleep(200 * time.Millisecond)
	if n := l.hits[1].Load(); n != 1 {
		t.Errorf("v2 hits = %d after a body of unknown length, want no mirror", n)
	}
}

func do(t *testing.T, c *http.Client, req *http.Request) (int, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
