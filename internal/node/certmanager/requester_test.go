package certmanager

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel-go/internal/api/caapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// testCAServer is a minimal IstioCertificateService: it checks the caller's
// token and metadata like istiod's node authorizer would, then signs the
// impersonated identity with a ca.CA.
type testCAServer struct {
	caapi.UnimplementedIstioCertificateServiceServer
	ca        *ca.CA
	wantToken string

	mu       sync.Mutex
	tokens   []string
	requests []*caapi.IstioCertificateRequest
	md       metadata.MD
}

func (s *testCAServer) CreateCertificate(ctx context.Context, req *caapi.IstioCertificateRequest) (*caapi.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	auth := md.Get("authorization")
	s.mu.Lock()
	s.requests = append(s.requests, req)
	s.md = md
	if len(auth) == 1 {
		s.tokens = append(s.tokens, auth[0])
	}
	want := s.wantToken
	s.mu.Unlock()
	if len(auth) != 1 || auth[0] != "Bearer "+want {
		return nil, status.Error(codes.Unauthenticated, "authenticate: bad token")
	}
	imp := req.GetMetadata().GetFields()[impersonatedIdentityKey].GetStringValue()
	id, err := identity.Parse(imp)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "ImpersonatedIdentity: %v", err)
	}
	chain, err := s.ca.Sign([]byte(req.GetCsr()), id, time.Duration(req.GetValidityDuration())*time.Second)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &caapi.IstioCertificateResponse{CertChain: chain}, nil
}

func (s *testCAServer) setToken(tok string) {
	s.mu.Lock()
	s.wantToken = tok
	s.mu.Unlock()
}

// servingCert is a self-signed TLS certificate for 127.0.0.1.
func servingCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := identity.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "test istiod"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{netip.MustParseAddr("127.0.0.1").AsSlice()},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func startCAServer(t *testing.T, token string) (*testCAServer, string, *x509.CertPool) {
	t.Helper()
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cert, pool := servingCert(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	impl := &testCAServer{ca: authority, wantToken: token}
	caapi.RegisterIstioCertificateServiceServer(srv, impl)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return impl, lis.Addr().String(), pool
}

func TestGRPCRequester(t *testing.T) {
	srv, addr, pool := startCAServer(t, "token-1")
	tokenFile := filepath.Join(t.TempDir(), "istio-token")
	if err := os.WriteFile(tokenFile, []byte("token-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	req, err := NewGRPCRequester(GRPCConfig{
		Address:   addr,
		RootCAs:   pool,
		Token:     FileToken(tokenFile),
		ClusterID: "Kubernetes",
		Headers:   map[string]string{"X-Extra": "yes"},
		TTL:       time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = req.Close() })
	m, err := New(Config{}, Deps{Requester: req})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })

	c := fetch(t, m, idA)
	if got := c.NotAfter().Sub(c.NotBefore()); got != time.Hour {
		t.Fatalf("certificate lifetime %v, want the requested 1h", got)
	}
	if len(c.RootCerts) != 1 || !c.RootCerts[0].Equal(srv.ca.Root()) {
		t.Fatal("trust bundle is not the CA root")
	}
	srv.mu.Lock()
	r, md := srv.requests[0], srv.md
	srv.mu.Unlock()
	if r.GetValidityDuration() != 3600 {
		t.Errorf("validity_duration = %d, want 3600", r.GetValidityDuration())
	}
	if got := r.GetMetadata().GetFields()[impersonatedIdentityKey].GetStringValue(); got != idA.String() {
		t.Errorf("ImpersonatedIdentity = %q, want %q", got, idA)
	}
	if got := md.Get("clusterid"); len(got) != 1 || got[0] != "Kubernetes" {
		t.Errorf("clusterid = %v", got)
	}
	if got := md.Get("x-extra"); len(got) != 1 || got[0] != "yes" {
		t.Errorf("x-extra = %v", got)
	}
	b, _ := pem.Decode([]byte(r.GetCsr()))
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil || len(csr.URIs) != 1 || csr.URIs[0].String() != idA.String() || csr.SignatureAlgorithm != x509.ECDSAWithSHA256 {
		t.Errorf("CSR = %+v, %v", csr, err)
	}

	// The token file is re-read for every request.
	srv.setToken("token-2")
	if err := os.WriteFile(tokenFile, []byte("token-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	fetch(t, m, idB)
	srv.mu.Lock()
	tokens := append([]string(nil), srv.tokens...)
	srv.mu.Unlock()
	if len(tokens) != 2 || tokens[1] != "Bearer token-2" {
		t.Fatalf("tokens seen = %v", tokens)
	}

	// A rejected token is an Unauthenticated error with an operator hint.
	srv.setToken("token-3")
	_, err = m.Fetch(context.Background(), idC)
	if !errors.Is(err, ErrUnavailable) || status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Fetch err = %v, want ErrUnavailable from Unauthenticated", err)
	}
	t.Logf("rejected token: %v", err)
	if !strings.Contains(err.Error(), "CA_TRUSTED_NODE_ACCOUNTS") {
		t.Fatalf("Fetch err = %v, want the operator hint", err)
	}
}

func TestGRPCRequesterDedicatedAndStatic(t *testing.T) {
	srv, addr, pool := startCAServer(t, "static")
	req, err := NewGRPCRequester(GRPCConfig{Address: addr, RootCAs: pool, Token: StaticToken("static"), Dedicated: true})
	if err != nil {
		t.Fatal(err)
	}
	defer req.Close()
	csrKey, _ := identity.GenerateKey()
	csr, _ := identity.NewCSR(idA, csrKey)
	// The test server insists on ImpersonatedIdentity, so dedicated mode is refused.
	_, err = req.Request(context.Background(), idA, csr)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Request err = %v, want InvalidArgument for the missing ImpersonatedIdentity", err)
	}
	srv.mu.Lock()
	r := srv.requests[0]
	srv.mu.Unlock()
	if r.GetMetadata() != nil || r.GetValidityDuration() != int64(DefaultTTL/time.Second) {
		t.Fatalf("request metadata %v, validity %d; want none and %d", r.GetMetadata(), r.GetValidityDuration(), int64(DefaultTTL/time.Second))
	}
}

func TestNewGRPCRequesterValidates(t *testing.T) {
	tests := []struct {
		name string
		cfg  GRPCConfig
		want string
	}{
		{"no address", GRPCConfig{Insecure: true}, "address is required"},
		{"no roots", GRPCConfig{Address: "127.0.0.1:1"}, "root certificates are required"},
		{"tiny ttl", GRPCConfig{Address: "127.0.0.1:1", Insecure: true, TTL: time.Millisecond}, "below one second"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewGRPCRequester(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want containing %q", err, tt.want)
			}
		})
	}
}

func TestFileToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tok")
	src := FileToken(path)
	if _, err := src(context.Background()); err == nil {
		t.Fatal("missing token file accepted")
	}
	if err := os.WriteFile(path, []byte("  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := src(context.Background()); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty token file: err = %v", err)
	}
	if err := os.WriteFile(path, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := src(context.Background()); err != nil || tok != "abc" {
		t.Fatalf("token = %q, %v", tok, err)
	}
}
