package xdsserver

import (
	"crypto/tls"
	"crypto/x509"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

func TestFullSync(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{
		"Kubernetes//Pod/default/a": workload("Kubernetes//Pod/default/a", "10.1.0.1"),
		"Kubernetes//Pod/default/b": workload("Kubernetes//Pod/default/b", "10.1.0.2"),
	}))
	srv.SetResources(xds.AuthorizationType, authzSet(map[string]*securityapi.Authorization{
		"default/allow": policy("default", "allow"),
	}))
	c := startClient(t, srv.addr)
	waitClosed(t, "Synced", c.Synced())

	if got, want := c.sink.names(xds.AddressType), []string{"Kubernetes//Pod/default/a", "Kubernetes//Pod/default/b"}; !slices.Equal(got, want) {
		t.Errorf("addresses = %v, want %v", got, want)
	}
	if got, want := c.sink.names(xds.AuthorizationType), []string{"default/allow"}; !slices.Equal(got, want) {
		t.Errorf("authorizations = %v, want %v", got, want)
	}
	if got := c.sink.address("Kubernetes//Pod/default/a"); !proto.Equal(got, workload("Kubernetes//Pod/default/a", "10.1.0.1")) {
		t.Errorf("address a decoded as %v", got)
	}
	for _, typ := range gatedTypes {
		if got, want := c.ResourceVersions(typ), srv.Versions(typ); !maps.Equal(got, want) {
			t.Errorf("%s: client versions %v, server versions %v", typ, got, want)
		}
	}
	if got := srv.Clients(); got != 1 {
		t.Errorf("Clients() = %d, want 1", got)
	}
	testkit.Eventually(t, waitTimeout, "node id on the server", func() bool { return slices.Equal(srv.Nodes(), []string{testNode.ID()}) })
	if n := counter(t, c.reg, "istio_xds_message_total", "url", xds.AddressType); n != 1 {
		t.Errorf("istio_xds_message_total{url=Address} = %v, want 1", n)
	}
	if n := counter(t, c.reg, "istio_xds_message_bytes_total", "url", xds.AddressType); n <= 0 {
		t.Errorf("istio_xds_message_bytes_total{url=Address} = %v, want > 0", n)
	}

	// The first request carries the node with its metadata.
	first := srv.reqs.all()[0]
	md := first.GetNode().GetMetadata().GetFields()
	for k, want := range map[string]string{"NAME": "ztunnel-abc", "NAMESPACE": "istio-system", "INSTANCE_IPS": "10.0.0.5", "NODE_NAME": "node-1"} {
		if got := md[k].GetStringValue(); got != want {
			t.Errorf("node metadata %s = %q, want %q", k, got, want)
		}
	}
	// Both initial requests are wildcard subscriptions.
	for _, r := range srv.reqs.all()[:2] {
		if len(r.GetResourceNamesSubscribe()) != 0 || r.GetResponseNonce() != "" {
			t.Errorf("initial request %v is not a wildcard subscription", r)
		}
	}
}

func TestSyncedWithEmptyType(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"w": workload("w", "10.1.0.1")}))
	// No authorizations at all: the server still answers the first request.
	srv.SetResources(xds.AuthorizationType, nil)
	c := startClient(t, srv.addr)
	waitClosed(t, "Synced", c.Synced())
	if got := c.sink.names(xds.AuthorizationType); len(got) != 0 {
		t.Errorf("authorizations = %v, want none", got)
	}
}

func TestIncrementalPushAndRemoval(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	set := map[string]*workloadapi.Address{
		"a": workload("a", "10.1.0.1"),
		"b": workload("b", "10.1.0.2"),
		"c": workload("c", "10.1.0.3"),
	}
	srv.SetResources(xds.AddressType, addrSet(set))
	srv.SetResources(xds.AuthorizationType, nil)
	c := startClient(t, srv.addr)
	waitClosed(t, "Synced", c.Synced())
	base := c.sink.callCount()

	// Same content in fresh messages: nothing is pushed. A change of b is
	// pushed alone; if the identical set had been pushed it would show up as
	// an extra call before it.
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{
		"a": workload("a", "10.1.0.1"),
		"b": workload("b", "10.1.0.2"),
		"c": workload("c", "10.1.0.3"),
	}))
	set["b"] = workload("b", "10.1.0.22")
	srv.SetResources(xds.AddressType, addrSet(set))
	testkit.Eventually(t, waitTimeout, "b updated", func() bool {
		return proto.Equal(c.sink.address("b"), workload("b", "10.1.0.22"))
	})
	if got, want := c.sink.callsSince(base), []sinkCall{{typeURL: xds.AddressType, upserts: []string{"b"}}}; !equalCalls(got, want) {
		t.Fatalf("sink calls after change = %+v, want %+v", got, want)
	}

	// Removal.
	base = c.sink.callCount()
	delete(set, "c")
	srv.SetResources(xds.AddressType, addrSet(set))
	testkit.Eventually(t, waitTimeout, "c removed", func() bool { return c.sink.address("c") == nil })
	if got, want := c.sink.callsSince(base), []sinkCall{{typeURL: xds.AddressType, removes: []string{"c"}}}; !equalCalls(got, want) {
		t.Fatalf("sink calls after removal = %+v, want %+v", got, want)
	}
	testkit.Eventually(t, waitTimeout, "versions", func() bool { return maps.Equal(c.ResourceVersions(xds.AddressType), srv.Versions(xds.AddressType)) })
	if _, ok := c.ResourceVersions(xds.AddressType)["c"]; ok {
		t.Error("client still tracks a version for removed c")
	}
}

func equalCalls(a, b []sinkCall) bool {
	return slices.EqualFunc(a, b, func(x, y sinkCall) bool {
		return x.typeURL == y.typeURL && slices.Equal(x.upserts, y.upserts) && slices.Equal(x.removes, y.removes)
	})
}

func TestRejectedResourceNACK(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	srv.SetResources(xds.AuthorizationType, nil)
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{
		"good-1": workload("good-1", "10.1.0.1"),
		"bad-1":  workload("bad-1", "10.1.0.2"),
	}))
	c := startClient(t, srv.addr)
	waitClosed(t, "Synced", c.Synced())

	if got, want := c.sink.names(xds.AddressType), []string{"good-1"}; !slices.Equal(got, want) {
		t.Errorf("sink holds %v, want %v (good resources still applied)", got, want)
	}
	versions := c.ResourceVersions(xds.AddressType)
	if _, ok := versions["bad-1"]; ok {
		t.Error("client recorded a version for the rejected bad-1")
	}
	if versions["good-1"] != srv.Versions(xds.AddressType)["good-1"] {
		t.Errorf("good-1 version %q not recorded", versions["good-1"])
	}

	testkit.Eventually(t, waitTimeout, "server NACK log", func() bool { return srv.logs.FilterMessageSnippet("NACK").Len() > 0 })
	entry := srv.logs.FilterMessageSnippet("NACK").All()[0]
	fields := entry.ContextMap()
	if msg, _ := fields["message"].(string); !strings.Contains(msg, `"bad-1"`) || !strings.Contains(msg, "fake sink refuses bad names") {
		t.Errorf("server saw NACK message %q, want it to name bad-1 and the sink's reason", msg)
	}
	if fields["node"] != testNode.ID() {
		t.Errorf("NACK logged for node %v, want %s", fields["node"], testNode.ID())
	}
	if n := counter(t, srv.reg, "xds_server_nacks_total", "url", xds.AddressType); n != 1 {
		t.Errorf("xds_server_nacks_total = %v, want 1", n)
	}
	if n := c.logs.FilterMessageSnippet("NACK").Len(); n != 1 {
		t.Errorf("client logged %d NACK lines, want 1", n)
	}

	// Fixing the resource (new content) is accepted.
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{
		"good-1": workload("good-1", "10.1.0.1"),
		"good-2": workload("good-2", "10.1.0.2"),
	}))
	testkit.Eventually(t, waitTimeout, "good-2", func() bool { return c.sink.address("good-2") != nil })
}

// TestServerRestartResync restarts the control plane on the same port. The
// client keeps its state meanwhile, resumes with initial_resource_versions,
// receives only what changed and drops what disappeared.
func TestServerRestartResync(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	addrs := map[string]*workloadapi.Address{
		"a": workload("a", "10.1.0.1"),
		"b": workload("b", "10.1.0.2"),
		"c": workload("c", "10.1.0.3"),
	}
	authz := map[string]*securityapi.Authorization{"ns/p1": policy("ns", "p1")}
	srv.SetResources(xds.AddressType, addrSet(addrs))
	srv.SetResources(xds.AuthorizationType, authzSet(authz))
	c := startClient(t, srv.addr)
	waitClosed(t, "Synced", c.Synced())
	held := map[string]map[string]string{}
	for _, typ := range gatedTypes {
		held[typ] = c.ResourceVersions(typ)
	}

	srv.gs.Stop()
	testkit.Eventually(t, waitTimeout, "client to notice", func() bool {
		return counter(t, c.reg, "istio_xds_connection_terminations_total") >= 1
	})
	before := c.sink.callCount()
	if got := c.sink.names(xds.AddressType); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("while disconnected the sink holds %v, want the last good state", got)
	}

	// Restarted control plane: a unchanged, b changed, c deleted, d new; p1
	// unchanged. The client reaches it before it has loaded its state: the
	// server must hold the stream rather than answer "remove everything".
	srv2 := startServer(t, srv.addr)
	testkit.Eventually(t, waitTimeout, "client stream on the new server", func() bool { return srv2.reqs.streams() >= 1 })
	if n := c.sink.callCount(); n != before {
		t.Fatalf("sink got %+v from a server without state", c.sink.callsSince(before))
	}
	delete(addrs, "c")
	addrs["b"] = workload("b", "10.1.0.22")
	addrs["d"] = workload("d", "10.1.0.4")
	srv2.SetResources(xds.AddressType, addrSet(addrs))
	srv2.SetResources(xds.AuthorizationType, authzSet(authz))

	testkit.Eventually(t, waitTimeout, "resync", func() bool {
		return slices.Equal(c.sink.names(xds.AddressType), []string{"a", "b", "d"}) &&
			proto.Equal(c.sink.address("b"), workload("b", "10.1.0.22"))
	})
	var upserts, removes []string
	for _, call := range c.sink.callsSince(before) {
		if call.typeURL != xds.AddressType {
			t.Errorf("unexpected %s call %+v: p1 is unchanged", call.typeURL, call)
		}
		upserts = append(upserts, call.upserts...)
		removes = append(removes, call.removes...)
	}
	slices.Sort(upserts)
	if !slices.Equal(upserts, []string{"b", "d"}) || !slices.Equal(removes, []string{"c"}) {
		t.Errorf("after restart sink got upserts %v removes %v, want [b d] and [c]", upserts, removes)
	}

	// The reconnect carried the versions held.
	got := map[string]map[string]string{}
	for _, r := range srv2.reqs.all() {
		if r.GetResponseNonce() == "" {
			got[r.GetTypeUrl()] = r.GetInitialResourceVersions()
		}
	}
	for _, typ := range gatedTypes {
		if !maps.Equal(got[typ], held[typ]) {
			t.Errorf("%s initial_resource_versions = %v, want %v", typ, got[typ], held[typ])
		}
	}
	testkit.Eventually(t, waitTimeout, "versions", func() bool { return maps.Equal(c.ResourceVersions(xds.AddressType), srv2.Versions(xds.AddressType)) })
}

// authServer answers only streams with the expected metadata and records the
// authorization values it saw.
type authServer struct {
	want map[string]string // metadata key → required value (authorization excluded)

	mu     sync.Mutex
	tokens []string
	valid  map[string]bool // accepted authorization values
}

func (a *authServer) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	md, _ := metadata.FromIncomingContext(ss.Context())
	auth := strings.Join(md.Get("authorization"), ",")
	a.mu.Lock()
	a.tokens = append(a.tokens, auth)
	ok := a.valid[auth]
	a.mu.Unlock()
	if !ok {
		return status.Error(codes.Unauthenticated, "bad token")
	}
	for k, v := range a.want {
		if got := md.Get(k); len(got) != 1 || got[0] != v {
			return status.Errorf(codes.PermissionDenied, "metadata %s = %v, want %s", k, got, v)
		}
	}
	return h(srv, ss)
}

func (a *authServer) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.tokens)
}

func TestBearerTokenFromFileAndMetadata(t *testing.T) {
	auth := &authServer{
		want:  map[string]string{"clusterid": "cluster-7", "x-extra": "yes"},
		valid: map[string]bool{"Bearer tok-1": true, "Bearer tok-2": true},
	}
	srv := startServer(t, "127.0.0.1:0", grpc.StreamInterceptor(auth.intercept))
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.1.0.1")}))
	srv.SetResources(xds.AuthorizationType, nil)
	tokenFile := filepath.Join(t.TempDir(), "istio-token")
	if err := os.WriteFile(tokenFile, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startClient(t, srv.addr, func(cfg *xds.ClientConfig) {
		cfg.TokenFile = tokenFile
		cfg.ClusterID = "cluster-7"
		cfg.Headers = map[string]string{"x-extra": "yes"}
	})
	waitClosed(t, "Synced", c.Synced())
	if got := auth.seen(); !slices.Equal(got, []string{"Bearer tok-1"}) {
		t.Fatalf("server saw authorization %v, want [Bearer tok-1]", got)
	}

	// The token file is re-read on reconnect.
	if err := os.WriteFile(tokenFile, []byte("tok-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.gs.Stop()
	srv2 := startServer(t, srv.addr, grpc.StreamInterceptor(auth.intercept))
	srv2.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.1.0.1")}))
	srv2.SetResources(xds.AuthorizationType, nil)
	testkit.Eventually(t, waitTimeout, "reconnect with the new token", func() bool { return srv2.Clients() == 1 })
	if got := auth.seen(); got[len(got)-1] != "Bearer tok-2" {
		t.Errorf("after reconnect server saw %v, want the last to be Bearer tok-2", got)
	}
}

func TestRejectedTokenNeverSyncs(t *testing.T) {
	auth := &authServer{valid: map[string]bool{"Bearer right": true}}
	srv := startServer(t, "127.0.0.1:0", grpc.StreamInterceptor(auth.intercept))
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.1.0.1")}))
	srv.SetResources(xds.AuthorizationType, nil)
	c := startClient(t, srv.addr, func(cfg *xds.ClientConfig) { cfg.Token = "wrong" })
	testkit.Eventually(t, waitTimeout, "retries", func() bool {
		return counter(t, c.reg, "istio_xds_connection_terminations_total", "reason", xds.ReasonConnectionError) >= 3
	})
	select {
	case <-c.Synced():
		t.Fatal("client synced with a rejected token")
	default:
	}
	if n := c.sink.callCount(); n != 0 {
		t.Errorf("sink got %d calls", n)
	}
	// One warning per backoff step, not per attempt: the first failures
	// are at distinct steps, so there is at least one line and never more
	// than attempts.
	attempts := counter(t, c.reg, "istio_xds_connection_terminations_total", "reason", xds.ReasonConnectionError)
	if n := c.logs.FilterMessageSnippet("xds failing; retrying").Len(); n < 1 || float64(n) > attempts {
		t.Errorf("%d connect-failure warnings for %v attempts, want one per backoff step", n, attempts)
	}
}

func TestTLS(t *testing.T) {
	pki := newTestPKI(t)
	other := newTestPKI(t)
	tests := []struct {
		name       string
		roots      *x509.CertPool
		serverName string
		wantSync   bool
	}{
		{name: "trusted CA, IP SAN", roots: pki.pool, wantSync: true},
		{name: "trusted CA, DNS SAN", roots: pki.pool, serverName: "xds.test", wantSync: true},
		{name: "untrusted CA", roots: other.pool},
		{name: "wrong name", roots: pki.pool, serverName: "other.test"},
	}
	srv := startServer(t, "127.0.0.1:0", grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pki.server}})))
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.1.0.1")}))
	srv.SetResources(xds.AuthorizationType, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startClient(t, srv.addr, func(cfg *xds.ClientConfig) {
				cfg.Insecure = false
				cfg.RootCAs = tt.roots
				cfg.ServerName = tt.serverName
			})
			if tt.wantSync {
				waitClosed(t, "Synced", c.Synced())
				if got := c.sink.names(xds.AddressType); !slices.Equal(got, []string{"a"}) {
					t.Errorf("addresses = %v", got)
				}
				return
			}
			testkit.Eventually(t, waitTimeout, "a failed handshake", func() bool {
				return counter(t, c.reg, "istio_xds_connection_terminations_total", "reason", xds.ReasonConnectionError) >= 1
			})
			if c.sink.callCount() != 0 {
				t.Error("sink was fed over an untrusted connection")
			}
		})
	}
}

// TestManyClients runs many clients in one process (what bench/xds does):
// every client gets a change, and each metrics registry is its own.
func TestManyClients(t *testing.T) {
	const n = 30
	srv := startServer(t, "127.0.0.1:0")
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.1.0.1")}))
	srv.SetResources(xds.AuthorizationType, nil)
	clients := make([]*testClient, n)
	for i := range clients {
		clients[i] = startClient(t, srv.addr, func(cfg *xds.ClientConfig) { cfg.Registerer = nil })
	}
	for _, c := range clients {
		waitClosed(t, "Synced", c.Synced())
	}
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{"a": workload("a", "10.1.0.99")}))
	for i, c := range clients {
		testkit.Eventually(t, waitTimeout, "change on every client", func() bool {
			return proto.Equal(c.sink.address("a"), workload("a", "10.1.0.99"))
		})
		if calls := c.sink.callsSince(0); len(calls) != 2 {
			t.Errorf("client %d: %d sink calls, want 2 (initial and the change)", i, len(calls))
		}
	}
	if got := srv.Clients(); got != n {
		t.Errorf("Clients() = %d, want %d", got, n)
	}
	if got := counter(t, srv.reg, "xds_server_clients"); got != n {
		t.Errorf("xds_server_clients = %v, want %d", got, n)
	}
}
