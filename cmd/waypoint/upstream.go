package main

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// upstream is how the waypoint reaches its control plane: the xDS client and
// CA requester configurations, both verifying the server against the roots
// of --root-cert in force at each (re)connect. The file is watched and
// reloaded on change (as the node proxy does with XDS_ROOT_CA and
// CA_ROOT_CA), so a rotated istiod certificate is trusted without a restart;
// a rewrite that does not parse is refused and the previous roots stay.
type upstream struct {
	roots *certmanager.RootFile
	ca    certmanager.GRPCConfig
	// xds lacks the waypoint's Sink, Log and Registerer; run fills them.
	xds xds.ClientConfig
}

// newUpstream loads --root-cert (the first read must succeed and parse) and
// builds the xDS and CA configurations from o.
func newUpstream(o *options, log *zap.Logger) (*upstream, error) {
	roots, err := certmanager.LoadRootFile(o.RootCert, log.Named("roots"))
	if err != nil {
		return nil, fmt.Errorf("--root-cert: %w", err)
	}
	token := certmanager.FileToken(o.TokenFile)
	tokenFile := o.TokenFile
	if o.Token != "" {
		token, tokenFile = certmanager.StaticToken(o.Token), ""
	}
	return &upstream{
		roots: roots,
		ca:    certmanager.GRPCConfig{Address: o.CAAddress, Roots: roots.Pool, Token: token},
		xds:   xds.ClientConfig{Address: o.XDSAddress, Roots: roots.Pool, TokenFile: tokenFile, Token: o.Token},
	}, nil
}

// watch re-reads the root file every interval (<= 0: the certmanager
// default) until ctx is done.
func (u *upstream) watch(ctx context.Context, interval time.Duration) {
	_ = u.roots.Run(ctx, interval)
}
