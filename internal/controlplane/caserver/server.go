// Package caserver is the control plane's certificate service: Istio's
// IstioCertificateService/CreateCertificate over gRPC, with caller
// authentication (Authenticator; local mode: per-node static bearer tokens)
// and Istio's node impersonation rule: a node proxy gets certificates only
// for identities of workloads scheduled on its own node. The same
// Authenticator guards the xDS stream through UnaryInterceptor and
// StreamInterceptor.
//
// It does not sign anything itself (internal/controlplane/ca does) and does not
// know the cluster: a Placement answers "does ns/sa run on node N?".
package caserver

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel-go/internal/api/caapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// ImpersonatedIdentityKey is the request metadata key a node proxy uses to
// name the workload identity it asks for.
const ImpersonatedIdentityKey = "ImpersonatedIdentity"

// Placement tells where workloads run.
type Placement interface {
	// OnNode reports whether some current workload with service account
	// namespace/serviceAccount is scheduled on node.
	OnNode(node, namespace, serviceAccount string) bool
}

// PlacementFunc adapts a function to Placement.
type PlacementFunc func(node, namespace, serviceAccount string) bool

// OnNode implements Placement.
func (f PlacementFunc) OnNode(node, ns, sa string) bool { return f(node, ns, sa) }

// Config configures a Server. CA, Auth and Placement are required.
type Config struct {
	CA        *ca.CA
	Auth      Authenticator
	Placement Placement
	// Log receives one line per refused request. nil: no logs.
	Log *zap.Logger
}

// Server implements caapi.IstioCertificateServiceServer.
type Server struct {
	caapi.UnimplementedIstioCertificateServiceServer
	ca        *ca.CA
	auth      Authenticator
	placement Placement
	log       *zap.Logger
}

// New validates cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.CA == nil || cfg.Auth == nil || cfg.Placement == nil {
		return nil, errors.New("caserver: CA, Auth and Placement are required")
	}
	return &Server{ca: cfg.CA, auth: cfg.Auth, placement: cfg.Placement, log: orNop(cfg.Log)}, nil
}

// Register registers the service on g.
func (s *Server) Register(g *grpc.Server) { caapi.RegisterIstioCertificateServiceServer(g, s) }

// CreateCertificate implements the CA service. Errors: Unauthenticated (no
// or bad credentials), InvalidArgument (bad CSR or identity), PermissionDenied
// (identity not allowed for this caller), Internal (signing failed).
func (s *Server) CreateCertificate(ctx context.Context, req *caapi.IstioCertificateRequest) (*caapi.IstioCertificateResponse, error) {
	caller, ok := CallerFromContext(ctx)
	if !ok {
		var err error
		if caller, err = s.auth.Authenticate(ctx); err != nil {
			s.log.Warn("certificate refused", zap.String("peer", peerAddr(ctx)), zap.Error(err))
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
	}
	id, err := requestedIdentity(req)
	if err != nil {
		s.log.Warn("certificate refused", zap.Stringer("caller", caller), zap.Error(err))
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := s.authorize(caller, id); err != nil {
		s.log.Warn("certificate refused", zap.Stringer("caller", caller), zap.Stringer("identity", id), zap.Error(err))
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	ttl := time.Duration(req.GetValidityDuration()) * time.Second
	chain, err := s.ca.Sign([]byte(req.GetCsr()), id, ttl)
	if err != nil {
		code := codes.Internal
		if errors.Is(err, ca.ErrBadCSR) {
			code = codes.InvalidArgument
		}
		s.log.Warn("certificate refused", zap.Stringer("caller", caller), zap.Stringer("identity", id), zap.Error(err))
		return nil, status.Error(code, err.Error())
	}
	s.log.Debug("certificate issued", zap.Stringer("caller", caller), zap.Stringer("identity", id), zap.Duration("ttl", ttl))
	return &caapi.IstioCertificateResponse{CertChain: chain}, nil
}

// requestedIdentity: metadata ImpersonatedIdentity, else the CSR's URI SAN;
// when both are present they must agree.
func requestedIdentity(req *caapi.IstioCertificateRequest) (identity.Identity, error) {
	b, _ := pem.Decode([]byte(req.GetCsr()))
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return identity.Identity{}, fmt.Errorf("caserver: %w: csr is not a PEM CERTIFICATE REQUEST", ca.ErrBadCSR)
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return identity.Identity{}, fmt.Errorf("caserver: %w: %v", ca.ErrBadCSR, err)
	}
	var fromCSR string
	if len(csr.URIs) > 0 {
		fromCSR = csr.URIs[0].String()
	}
	var imp string
	if f := req.GetMetadata().GetFields()[ImpersonatedIdentityKey]; f != nil {
		imp = f.GetStringValue()
	}
	want := imp
	switch {
	case imp == "" && fromCSR == "":
		return identity.Identity{}, fmt.Errorf("caserver: %w: no SPIFFE URI SAN in the CSR and no %s metadata", ca.ErrBadCSR, ImpersonatedIdentityKey)
	case imp == "":
		want = fromCSR
	case fromCSR != "" && fromCSR != imp:
		return identity.Identity{}, fmt.Errorf("caserver: %w: CSR names %s but %s is %s", ca.ErrBadCSR, fromCSR, ImpersonatedIdentityKey, imp)
	}
	id, err := identity.Parse(want)
	if err != nil {
		return identity.Identity{}, fmt.Errorf("caserver: requested identity: %w", err)
	}
	return id, nil
}

// ErrNotPermitted is wrapped when a caller may not obtain an identity.
var ErrNotPermitted = errors.New("not permitted")

func (s *Server) authorize(c Caller, id identity.Identity) error {
	if id.TrustDomain != s.ca.TrustDomain() {
		return fmt.Errorf("caserver: %w: identity %s is outside trust domain %s", ErrNotPermitted, id, s.ca.TrustDomain())
	}
	if c.ServiceAccount != "" && c.ServiceAccount == id.Namespace+"/"+id.ServiceAccount {
		return nil
	}
	if c.Node != "" && s.placement.OnNode(c.Node, id.Namespace, id.ServiceAccount) {
		return nil
	}
	if c.Node == "" {
		return fmt.Errorf("caserver: %w: %s is not a node proxy and not %s", ErrNotPermitted, c, id)
	}
	return fmt.Errorf("caserver: %w: no workload with service account %s/%s runs on node %s", ErrNotPermitted, id.Namespace, id.ServiceAccount, c.Node)
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
