package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// seen is what the test control plane received, by gRPC method.
type seen struct {
	mu   sync.Mutex
	md   map[string]metadata.MD
	node map[string]string // xDS node metadata of the first ADS request
	got  chan string       // method names as they arrive
}

func (s *seen) handle(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	md, _ := metadata.FromIncomingContext(stream.Context())
	s.mu.Lock()
	s.md[method] = md
	s.mu.Unlock()
	if method == "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources" {
		var req discovery.DeltaDiscoveryRequest
		if err := stream.RecvMsg(&req); err != nil {
			return err
		}
		s.mu.Lock()
		for k, v := range req.GetNode().GetMetadata().GetFields() {
			s.node[k] = v.GetStringValue()
		}
		s.mu.Unlock()
	}
	s.got <- method
	return status.Error(codes.Unavailable, "test server records only")
}

// TestHeadersAndNodeMetadataReachTheControlPlane runs the production
// configuration path (environment → config → upstream → clients) against a
// TLS gRPC server at an IP whose certificate names only istiod's DNS name:
// XDS_HEADER_* / CA_HEADER_* arrive as metadata, ISTIO_META_* and
// ISTIO_VERSION as xDS node metadata.
func TestHeadersAndNodeMetadataReachTheControlPlane(t *testing.T) {
	rootPEM, cert := testCA(t, "istiod.istio-system.svc")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &seen{md: map[string]metadata.MD{}, node: map[string]string{}, got: make(chan string, 16)}
	srv := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&cert)), grpc.UnknownServiceHandler(s.handle))
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	token := filepath.Join(t.TempDir(), "istio-token")
	if err := os.WriteFile(token, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"NODE_NAME": "n1", "XDS_ADDRESS": lis.Addr().String(), "XDS_ROOT_CA": string(rootPEM),
		"CA_ROOT_CA": string(rootPEM), "ALT_XDS_HOSTNAME": "istiod.istio-system.svc", "ALT_CA_HOSTNAME": "istiod.istio-system.svc",
		"ISTIO_VERSION": "1.24.2", "CLUSTER_ID": "c1", "AUTH_TOKEN": token}
	environ := []string{"XDS_HEADER_x-xds-tenant=t1", "CA_HEADER_x-ca-tenant=t2", "ISTIO_META_DNS_CAPTURE=true"}
	cfg, err := config.Parse(func(k string) (string, bool) { v, ok := env[k]; return v, ok }, environ)
	if err != nil {
		t.Fatal(err)
	}
	up, err := remoteUpstream(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	xc, err := xds.NewClient(up.xdsConfig(cfg, state.NewStore()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = xc.Run(runCtx); close(done) }()
	defer func() { stopRun(); <-done }()
	req, err := certmanager.NewGRPCRequester(up.caConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer req.Close()
	_, _ = req.Request(ctx, identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "sa"}, []byte("csr"))

	const ads = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
	const caMethod = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
	for want := map[string]bool{ads: true, caMethod: true}; len(want) > 0; {
		select {
		case m := <-s.got:
			delete(want, m)
		case <-ctx.Done():
			t.Fatalf("server never saw %v", want)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for method, kv := range map[string][2]string{ads: {"x-xds-tenant", "t1"}, caMethod: {"x-ca-tenant", "t2"}} {
		if got := s.md[method].Get(kv[0]); len(got) != 1 || got[0] != kv[1] {
			t.Errorf("%s: metadata %s = %v, want [%s]", method, kv[0], got, kv[1])
		}
	}
	for _, method := range []string{ads, caMethod} { // AUTH_TOKEN's file, re-read per call
		if got := s.md[method].Get("authorization"); len(got) != 1 || got[0] != "Bearer tok" {
			t.Errorf("%s: authorization = %q, want [Bearer tok]", method, got)
		}
	}
	if got := s.md[ads].Get("x-ca-tenant"); len(got) != 0 {
		t.Errorf("CA header leaked into xDS: %v", got)
	}
	for k, want := range map[string]string{"ISTIO_VERSION": "1.24.2", "DNS_CAPTURE": "true", "CLUSTER_ID": "c1", "NODE_NAME": "n1"} {
		if got := s.node[k]; got != want {
			t.Errorf("node metadata %s = %q, want %q (all: %v)", k, got, want, s.node)
		}
	}
}
