package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/identity/reloadtls"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testpki"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
)

// testCA makes a root and a server certificate whose only SAN is dnsName.
func testCA(t *testing.T, dnsName string) (rootPEM []byte, server tls.Certificate) {
	t.Helper()
	root := testpki.NewRoot(t, "test root")
	return root.CertPEM(), root.Server(t, dnsName).TLS()
}

// handshake calls a gRPC health check at addr over the client credentials
// the CA requester uses, with the upstream's roots and server name; gRPC
// takes the authority it verifies from the credentials' ServerName.
func handshake(t *testing.T, addr string, roots func() *x509.CertPool, serverName string) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(reloadtls.Credentials(roots, serverName)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestAltHostnameAcceptsDNSOnlyCertAtIP(t *testing.T) {
	rootPEM, cert := testCA(t, "istiod.istio-system.svc")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&cert)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	addr := lis.Addr().String()
	for _, tc := range []struct {
		name   string
		env    map[string]string
		wantOK bool
	}{
		{"IP only fails", map[string]string{}, false},
		{"ALT_XDS_HOSTNAME and ALT_CA_HOSTNAME", map[string]string{"ALT_XDS_HOSTNAME": "istiod.istio-system.svc",
			"ALT_CA_HOSTNAME": "istiod.istio-system.svc"}, true},
		{"wrong ALT name fails", map[string]string{"ALT_XDS_HOSTNAME": "other.svc", "ALT_CA_HOSTNAME": "other.svc"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{"NODE_NAME": "n1", "XDS_ADDRESS": "https://" + addr, "XDS_ROOT_CA": string(rootPEM),
				"CA_ROOT_CA": string(rootPEM)}
			for k, v := range tc.env {
				m[k] = v
			}
			cfg, err := config.Parse(func(k string) (string, bool) { v, ok := m[k]; return v, ok }, nil)
			if err != nil {
				t.Fatal(err)
			}
			up, err := remoteUpstream(cfg, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			for _, side := range []struct {
				roots func() *x509.CertPool
				name  string
			}{{up.xdsRoots, up.xdsServerName}, {up.caRoots, up.caServerName}} {
				err := handshake(t, up.xdsAddr, side.roots, side.name)
				if (err == nil) != tc.wantOK {
					t.Fatalf("server name %q: handshake err = %v, want ok %v", side.name, err, tc.wantOK)
				}
			}
		})
	}
}

func TestRootSource(t *testing.T) {
	rootPEM, _ := testCA(t, "x")
	file := filepath.Join(t.TempDir(), "root.pem")
	if err := os.WriteFile(file, rootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name              string
		value             string
		wantFile, wantNil bool
		wantErr           string
	}{
		{name: "file is watched", value: file, wantFile: true},
		{name: "inline PEM", value: string(rootPEM)},
		{name: "system pool", value: "SYSTEM", wantNil: true},
		{name: "missing file", value: filepath.Join(t.TempDir(), "absent.pem"), wantErr: "no such file"},
		{name: "inline PEM without certificate", value: "-----BEGIN CERTIFICATE-----\nbm9wZQ==\n-----END CERTIFICATE-----\n", wantErr: "inline PEM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, f, err := rootSource(tc.value, zap.NewNop())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (f != nil) != tc.wantFile || (pool() == nil) != tc.wantNil {
				t.Fatalf("file %v pool %v, want file %v nil pool %v", f, pool(), tc.wantFile, tc.wantNil)
			}
		})
	}
	cfg := &config.Config{XDSRootCA: file, CARootCA: "SYSTEM"}
	up, err := remoteUpstream(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if up.watch == nil || up.xdsRoots() == nil || up.caRoots() != nil {
		t.Fatalf("file + SYSTEM: watch %v, xds pool %v, ca pool %v", up.watch != nil, up.xdsRoots(), up.caRoots())
	}
}

func TestNodeInfoMetadata(t *testing.T) {
	cfg := &config.Config{NodeName: "n1", ClusterID: "c1", Network: "net1",
		NodeMetadata: map[string]string{"ISTIO_VERSION": "1.24.2", "DNS_CAPTURE": "true"}}
	n := nodeInfo(cfg)
	want := map[string]string{"ISTIO_VERSION": "1.24.2", "DNS_CAPTURE": "true", "CLUSTER_ID": "c1", "NETWORK": "net1"}
	if len(n.Metadata) != len(want) {
		t.Fatalf("metadata %v, want %v", n.Metadata, want)
	}
	for k, v := range want {
		if n.Metadata[k] != v {
			t.Fatalf("metadata %v, want %v", n.Metadata, want)
		}
	}
	if _, ok := cfg.NodeMetadata["CLUSTER_ID"]; ok {
		t.Fatal("nodeInfo mutated the config's metadata")
	}
}
