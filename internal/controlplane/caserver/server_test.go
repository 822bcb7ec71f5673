package caserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/caapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

type testEnv struct {
	ca     *ca.CA
	client caapi.IstioCertificateServiceClient
}

// startServer serves the CA on 127.0.0.1:0 over TLS. Workload demo/client
// runs on node0, demo/server on node1.
func startServer(t *testing.T, interceptors bool) *testEnv {
	t.Helper()
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := NewNodeTokens(map[string]string{"node0": "tok0", "node1": "tok1"})
	if err != nil {
		t.Fatal(err)
	}
	placement := PlacementFunc(func(node, ns, sa string) bool {
		return node == "node0" && ns == "demo" && sa == "client" || node == "node1" && ns == "demo" && sa == "server"
	})
	srv, err := New(Config{CA: c, Auth: auth, Placement: placement})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ServingCertificate(c, DefaultServingNames("istio-system"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	opts := []grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))}
	if interceptors {
		opts = append(opts, grpc.UnaryInterceptor(UnaryInterceptor(auth, nil)), grpc.StreamInterceptor(StreamInterceptor(auth, nil)))
	}
	g := grpc.NewServer(opts...)
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)

	pool := x509.NewCertPool()
	pool.AddCert(c.Root())
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "istiod.istio-system.svc"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &testEnv{ca: c, client: caapi.NewIstioCertificateServiceClient(conn)}
}

func withToken(tok string) context.Context {
	ctx := context.Background()
	if tok != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	return ctx
}

func csrFor(t *testing.T, id identity.Identity) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := identity.NewCSR(id, key)
	if err != nil {
		t.Fatal(err)
	}
	return csr, key
}

func impersonate(id string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{ImpersonatedIdentityKey: structpb.NewStringValue(id)}}
}

func TestCreateCertificate(t *testing.T) {
	client := identity.MustNew("cluster.local", "demo", "client")
	server := identity.MustNew("cluster.local", "demo", "server")
	foreignTD := identity.MustNew("example.org", "demo", "client")
	clientCSR, clientKey := csrFor(t, client)
	serverCSR, _ := csrFor(t, server)
	foreignCSR, _ := csrFor(t, foreignTD)
	bareCSR := sanlessCSR(t)

	for _, interceptors := range []bool{false, true} {
		env := startServer(t, interceptors)
		name := map[bool]string{false: "direct", true: "interceptors"}[interceptors]
		t.Run(name+"/own node issued", func(t *testing.T) {
			resp, err := env.client.CreateCertificate(withToken("tok0"), &caapi.IstioCertificateRequest{
				Csr: string(clientCSR), ValidityDuration: 3600, Metadata: impersonate(client.String()),
			})
			if err != nil {
				t.Fatal(err)
			}
			wc, err := identity.FromChain(client, clientKey, resp.CertChain)
			if err != nil {
				t.Fatalf("chain does not verify: %v", err)
			}
			if _, err := wc.Leaf.Verify(x509.VerifyOptions{Roots: rootPool(env.ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Fatalf("leaf does not chain to the CA root: %v", err)
			}
			if got := wc.Leaf.URIs[0].String(); got != client.String() {
				t.Errorf("SAN = %s, want %s", got, client)
			}
			if d := wc.Leaf.NotAfter.Sub(wc.Leaf.NotBefore); d != time.Hour {
				t.Errorf("validity = %v, want the requested 1h", d)
			}
		})
		t.Run(name+"/CSR SAN only, default ttl", func(t *testing.T) {
			resp, err := env.client.CreateCertificate(withToken("tok1"), &caapi.IstioCertificateRequest{Csr: string(serverCSR)})
			if err != nil {
				t.Fatal(err)
			}
			certs, err := identity.ParseCertificatesPEM([]byte(resp.CertChain[0]))
			if err != nil {
				t.Fatal(err)
			}
			if d := certs[0].NotAfter.Sub(certs[0].NotBefore); d != ca.DefaultTTL {
				t.Errorf("validity = %v, want the default %v", d, ca.DefaultTTL)
			}
		})
		refusals := []struct {
			name    string
			token   string
			req     *caapi.IstioCertificateRequest
			code    codes.Code
			message string
		}{
			{"other node's workload", "tok1", &caapi.IstioCertificateRequest{Csr: string(clientCSR), Metadata: impersonate(client.String())},
				codes.PermissionDenied, "no workload with service account demo/client runs on node node1"},
			{"bad token", "nope", &caapi.IstioCertificateRequest{Csr: string(clientCSR)}, codes.Unauthenticated, "unknown token"},
			{"no token", "", &caapi.IstioCertificateRequest{Csr: string(clientCSR)}, codes.Unauthenticated, "no authorization metadata"},
			{"garbage CSR", "tok0", &caapi.IstioCertificateRequest{Csr: "hello", Metadata: impersonate(client.String())},
				codes.InvalidArgument, "invalid certificate signing request: csr is not a PEM CERTIFICATE REQUEST"},
			{"CSR and metadata disagree", "tok0", &caapi.IstioCertificateRequest{Csr: string(serverCSR), Metadata: impersonate(client.String())},
				codes.InvalidArgument, "CSR names spiffe://cluster.local/ns/demo/sa/server"},
			{"other trust domain", "tok0", &caapi.IstioCertificateRequest{Csr: string(foreignCSR)},
				codes.PermissionDenied, "outside trust domain"},
			{"not a workload id", "tok0", &caapi.IstioCertificateRequest{Csr: string(bareCSR), Metadata: impersonate("spiffe://cluster.local/foo")},
				codes.InvalidArgument, "not a workload identity"},
			{"no identity at all", "tok0", &caapi.IstioCertificateRequest{Csr: string(bareCSR)},
				codes.InvalidArgument, "no SPIFFE URI SAN in the CSR and no ImpersonatedIdentity"},
		}
		for _, tc := range refusals {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				_, err := env.client.CreateCertificate(withToken(tc.token), tc.req)
				st, _ := status.FromError(err)
				if st.Code() != tc.code || !strings.Contains(st.Message(), tc.message) {
					t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.message)
				}
			})
		}
	}
}

func TestParseNodeTokens(t *testing.T) {
	got, err := ParseNodeTokens([]byte("# nodes\nnode0 abc\n\n  node1   def  \n"))
	if err != nil || len(got) != 2 || got["node0"] != "abc" || got["node1"] != "def" {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"node0", "node0 a b", "node0 a\nnode0 b"} {
		if _, err := ParseNodeTokens([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := NewNodeTokens(map[string]string{"a": "x", "b": "x"}); err == nil {
		t.Error("shared token accepted")
	}
}

func rootPool(c *ca.CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.Root())
	return p
}

func sanlessCSR(t *testing.T) []byte {
	t.Helper()
	key, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}
