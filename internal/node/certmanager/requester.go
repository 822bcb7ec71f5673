package certmanager

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/identity/reloadtls"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/caapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// Requester asks a CA to sign csrPEM for id and returns the PEM chain, leaf
// first and trust bundle last (the shape of IstioCertificateResponse). It
// does not check the answer; the Manager does. Implementations must be safe
// for concurrent use and return promptly when ctx is done.
type Requester interface {
	Request(ctx context.Context, id identity.Identity, csrPEM []byte) ([]string, error)
}

// RequesterFunc adapts a function to Requester.
type RequesterFunc func(ctx context.Context, id identity.Identity, csrPEM []byte) ([]string, error)

// Request implements Requester.
func (f RequesterFunc) Request(ctx context.Context, id identity.Identity, csrPEM []byte) ([]string, error) {
	return f(ctx, id, csrPEM)
}

// TokenSource returns the bearer token for one CA request.
type TokenSource func(ctx context.Context) (string, error)

// FileToken reads the token from path on every call, so a rotated projected
// service-account token is picked up (surrounding whitespace is trimmed).
func FileToken(path string) TokenSource {
	return func(context.Context) (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("certmanager: read token: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("certmanager: token file %s is empty", path)
		}
		return tok, nil
	}
}

// StaticToken always returns tok.
func StaticToken(tok string) TokenSource {
	return func(context.Context) (string, error) { return tok, nil }
}

// DefaultTTL is the certificate lifetime requested when none is configured
// (Istio's SECRET_TTL default).
const DefaultTTL = 24 * time.Hour

// impersonatedIdentityKey is the IstioCertificateRequest metadata key a node
// proxy uses to ask for another workload's certificate.
const impersonatedIdentityKey = "ImpersonatedIdentity"

// GRPCConfig configures a GRPCRequester.
type GRPCConfig struct {
	// Address of the CA, host:port (CA_ADDRESS). Required.
	Address string
	// RootCAs verify the CA's serving certificate (CA_ROOT_CA). Required
	// unless Insecure is set.
	RootCAs *x509.CertPool
	// Roots, when set, wins over RootCAs and is asked at every connection
	// to the CA (a RootFile's Pool), so a reconnect uses reloaded roots.
	Roots func() *x509.CertPool
	// ServerName overrides the name checked in the CA's certificate
	// (ALT_CA_HOSTNAME); "" means the host of Address.
	ServerName string
	// Insecure dials without TLS. For tests only.
	Insecure bool
	// DialOptions are appended after the transport credentials.
	DialOptions []grpc.DialOption
	// Token supplies "authorization: Bearer <token>" per request; nil sends
	// no authorization header.
	Token TokenSource
	// ClusterID is sent as "clusterid" metadata; "" sends none.
	ClusterID string
	// Headers are extra metadata sent with every request (CA_HEADER_*); keys
	// are lowercased as gRPC requires. nil means none.
	Headers map[string]string
	// TTL is the requested validity (SECRET_TTL), sent in whole seconds; 0
	// means DefaultTTL.
	TTL time.Duration
	// Dedicated omits the ImpersonatedIdentity metadata (PROXY_MODE=dedicated,
	// where the proxy asks only for its own identity). false, the default, is
	// the shared node-proxy mode.
	Dedicated bool
}

// GRPCRequester is the Requester that calls Istio's
// IstioCertificateService/CreateCertificate.
type GRPCRequester struct {
	cfg    GRPCConfig
	conn   *grpc.ClientConn
	client caapi.IstioCertificateServiceClient
	md     metadata.MD // static metadata; per-request token added on top
}

// NewGRPCRequester creates the client connection (lazily connected, as
// grpc.NewClient does). Close releases it.
func NewGRPCRequester(cfg GRPCConfig) (*GRPCRequester, error) {
	if cfg.Address == "" {
		return nil, errors.New("certmanager: CA address is required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("certmanager: certificate TTL %v is below one second", cfg.TTL)
	}
	var creds credentials.TransportCredentials
	switch {
	case cfg.Insecure:
		creds = insecure.NewCredentials()
	case cfg.Roots != nil:
		creds = reloadtls.Credentials(cfg.Roots, cfg.ServerName)
	case cfg.RootCAs != nil:
		creds = credentials.NewTLS(&tls.Config{
			RootCAs:    cfg.RootCAs,
			ServerName: cfg.ServerName,
			MinVersion: tls.VersionTLS12,
		})
	default:
		return nil, errors.New("certmanager: CA root certificates are required (or Insecure for tests)")
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Address, opts...)
	if err != nil {
		return nil, fmt.Errorf("certmanager: CA client for %s: %w", cfg.Address, err)
	}
	md := metadata.MD{}
	for k, v := range cfg.Headers {
		md.Append(strings.ToLower(k), v)
	}
	if cfg.ClusterID != "" {
		md.Set("clusterid", cfg.ClusterID)
	}
	return &GRPCRequester{cfg: cfg, conn: conn, client: caapi.NewIstioCertificateServiceClient(conn), md: md}, nil
}

// Close closes the client connection.
func (g *GRPCRequester) Close() error { return g.conn.Close() }

// Request implements Requester.
func (g *GRPCRequester) Request(ctx context.Context, id identity.Identity, csrPEM []byte) ([]string, error) {
	md := g.md.Copy()
	if g.cfg.Token != nil {
		tok, err := g.cfg.Token(ctx)
		if err != nil {
			return nil, err
		}
		md.Set("authorization", "Bearer "+tok)
	}
	req := &caapi.IstioCertificateRequest{
		Csr:              string(csrPEM),
		ValidityDuration: int64(g.cfg.TTL / time.Second),
	}
	if !g.cfg.Dedicated {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			impersonatedIdentityKey: structpb.NewStringValue(id.String()),
		}}
	}
	resp, err := g.client.CreateCertificate(metadata.NewOutgoingContext(ctx, md), req)
	if err != nil {
		return nil, fmt.Errorf("certmanager: CreateCertificate at %s: %w%s", g.cfg.Address, err, hint(err))
	}
	if len(resp.GetCertChain()) == 0 {
		return nil, fmt.Errorf("certmanager: CreateCertificate at %s: empty certificate chain", g.cfg.Address)
	}
	return resp.GetCertChain(), nil
}

// hint adds the likely cause of predictable CA failures.
func hint(err error) string {
	switch status.Code(err) {
	case codes.Unauthenticated:
		return " (is the token valid, is the proxy's service account in istiod's CA_TRUSTED_NODE_ACCOUNTS, and does a pod with this identity run on this node?)"
	case codes.Unavailable:
		return " (is the CA address reachable, and does CA_ROOT_CA hold the root that signed its certificate?)"
	}
	return ""
}
