package caserver

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ErrUnauthenticated is wrapped by every Authenticator refusal.
var ErrUnauthenticated = errors.New("unauthenticated")

// Caller is who made a request, as an Authenticator established it.
type Caller struct {
	// Node the caller runs on: a node proxy may obtain certificates for the
	// workloads scheduled on this node. "" means not a node proxy.
	Node string
	// ServiceAccount "namespace/name" the caller itself runs as; it may
	// always obtain a certificate for that identity. "" means unknown.
	ServiceAccount string
}

func (c Caller) String() string {
	switch {
	case c.Node != "" && c.ServiceAccount != "":
		return "node " + c.Node + " (" + c.ServiceAccount + ")"
	case c.Node != "":
		return "node " + c.Node
	case c.ServiceAccount != "":
		return "service account " + c.ServiceAccount
	}
	return "anonymous"
}

// Authenticator establishes the caller of a gRPC request from its incoming
// metadata (metadata.FromIncomingContext). Errors wrap ErrUnauthenticated.
// Local mode uses NodeTokens; Kubernetes mode uses kubeauth.Authenticator
// (TokenReview of projected service account tokens, audience istio-ca).
type Authenticator interface {
	Authenticate(ctx context.Context) (Caller, error)
}

// NodeTokens authenticates node proxies by static bearer tokens
// ("authorization: Bearer <token>"), one per node.
type NodeTokens struct {
	tokens []nodeToken
}

type nodeToken struct {
	node  string
	token []byte
}

// NewNodeTokens builds the authenticator from node name → token. Tokens must
// be non-empty and distinct.
func NewNodeTokens(byNode map[string]string) (*NodeTokens, error) {
	n := &NodeTokens{}
	seen := map[string]string{}
	for node, tok := range byNode {
		if node == "" || tok == "" {
			return nil, fmt.Errorf("caserver: node tokens: empty node name or token (node %q)", node)
		}
		if other, dup := seen[tok]; dup {
			return nil, fmt.Errorf("caserver: node tokens: nodes %q and %q share a token", other, node)
		}
		seen[tok] = node
		n.tokens = append(n.tokens, nodeToken{node: node, token: []byte(tok)})
	}
	return n, nil
}

// ParseNodeTokens reads a node token file: one "<node-name> <token>" per
// line; blank lines and lines starting with # are ignored.
func ParseNodeTokens(data []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		f := strings.Fields(s)
		if len(f) != 2 {
			return nil, fmt.Errorf("caserver: node tokens line %d: want \"<node-name> <token>\"", line)
		}
		if _, dup := out[f[0]]; dup {
			return nil, fmt.Errorf("caserver: node tokens line %d: node %q listed twice", line, f[0])
		}
		out[f[0]] = f[1]
	}
	return out, sc.Err()
}

// Authenticate implements Authenticator.
func (n *NodeTokens) Authenticate(ctx context.Context) (Caller, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return Caller{}, fmt.Errorf("%w: no authorization metadata (want \"Bearer <node token>\")", ErrUnauthenticated)
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || tok == "" {
		return Caller{}, fmt.Errorf("%w: authorization metadata is not \"Bearer <token>\"", ErrUnauthenticated)
	}
	found := ""
	for _, t := range n.tokens { // compare all, in constant time each
		if subtle.ConstantTimeCompare(t.token, []byte(tok)) == 1 {
			found = t.node
		}
	}
	if found == "" {
		return Caller{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	return Caller{Node: found}, nil
}

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFromContext returns the caller an interceptor established.
func CallerFromContext(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// UnaryInterceptor authenticates every unary call with a, puts the Caller
// in the context and refuses unauthenticated calls with
// codes.Unauthenticated (logged once per refusal). log may be nil.
func UnaryInterceptor(a Authenticator, log *zap.Logger) grpc.UnaryServerInterceptor {
	log = orNop(log)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		c, err := a.Authenticate(ctx)
		if err != nil {
			log.Warn("refused unauthenticated call", zap.String("method", info.FullMethod), zap.String("peer", peerAddr(ctx)), zap.Error(err))
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		return h(WithCaller(ctx, c), req)
	}
}

// StreamInterceptor is UnaryInterceptor for streams (the xDS ADS stream).
func StreamInterceptor(a Authenticator, log *zap.Logger) grpc.StreamServerInterceptor {
	log = orNop(log)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		c, err := a.Authenticate(ss.Context())
		if err != nil {
			log.Warn("refused unauthenticated stream", zap.String("method", info.FullMethod), zap.String("peer", peerAddr(ss.Context())), zap.Error(err))
			return status.Error(codes.Unauthenticated, err.Error())
		}
		return h(srv, &callerStream{ServerStream: ss, ctx: WithCaller(ss.Context(), c)})
	}
}

type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *callerStream) Context() context.Context { return s.ctx }

func orNop(l *zap.Logger) *zap.Logger {
	if l == nil {
		return zap.NewNop()
	}
	return l
}
