package main

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// upstream is where the node proxy gets its state and certificates: the
// configured control plane, or the embedded one.
type upstream struct {
	xdsAddr, caAddr string
	// xdsRoots / caRoots return the roots in force (XDS_ROOT_CA,
	// CA_ROOT_CA), asked at every connection so reloads apply.
	xdsRoots, caRoots func() *x509.CertPool
	// xdsTokenFile / xdsToken: the xDS bearer token (file wins).
	xdsTokenFile, xdsToken string
	caToken                certmanager.TokenSource
	// run serves the embedded control plane until ctx is done; nil when
	// remote. It is started before anything dials.
	run func(ctx context.Context) error
	// watch re-reads the root files until ctx is done; nil when there are
	// none to watch (embedded control plane).
	watch func(ctx context.Context) error
}

// remoteUpstream reads the roots and token locations of XDS_ADDRESS and
// CA_ADDRESS. The root files are watched (watch) and reloaded on change,
// as Istio's ztunnel does; one file named by both is read once.
func remoteUpstream(cfg *config.Config, log *zap.Logger) (*upstream, error) {
	xdsRoots, err := certmanager.LoadRootFile(cfg.XDSRootCA, log.With(zap.String("env", config.EnvXDSRootCA)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", config.EnvXDSRootCA, err)
	}
	caRoots := xdsRoots
	if cfg.CARootCA != cfg.XDSRootCA {
		if caRoots, err = certmanager.LoadRootFile(cfg.CARootCA, log.With(zap.String("env", config.EnvCARootCA))); err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvCARootCA, err)
		}
	}
	files := []*certmanager.RootFile{xdsRoots}
	if caRoots != xdsRoots {
		files = append(files, caRoots)
	}
	return &upstream{
		xdsAddr: cfg.XDSAddress, caAddr: cfg.CAAddress, xdsRoots: xdsRoots.Pool, caRoots: caRoots.Pool,
		xdsTokenFile: cfg.AuthToken, caToken: certmanager.FileToken(cfg.AuthToken),
		watch: func(ctx context.Context) error {
			var wg sync.WaitGroup
			for _, f := range files {
				wg.Go(func() { _ = f.Run(ctx, certmanager.DefaultRootPoll) })
			}
			wg.Wait()
			return nil
		},
	}, nil
}

// localUpstream embeds the control plane over cfg.LocalConfigDir: a fresh
// in-memory root CA, one random bearer token for this node only, and the
// xDS+CA gRPC server on a loopback port. The node proxy then talks to it
// exactly as to a remote one (TLS, token, node impersonation rule), so
// local mode runs the production path end to end.
func localUpstream(cfg *config.Config, log *zap.Logger, reg prometheus.Registerer) (*upstream, error) {
	authority, err := ca.New(ca.Options{TrustDomain: cfg.TrustDomain})
	if err != nil {
		return nil, err
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(raw[:])
	auth, err := caserver.NewNodeTokens(map[string]string{cfg.NodeName: token})
	if err != nil {
		return nil, err
	}
	src := local.New(cfg.LocalConfigDir, log.Named("source"), 0)
	tcfg := translate.LocalDefaults()
	tcfg.TrustDomain, tcfg.ClusterID = cfg.TrustDomain, cfg.ClusterID
	cp, err := controlplane.New(controlplane.Config{
		Source: src, SourceErrors: src.Errors, Translate: tcfg,
		CA: authority, Auth: auth, Log: log, Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("embedded control plane: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(authority.Root())
	addr := lis.Addr().String()
	log.Info("embedded control plane", zap.String("dir", cfg.LocalConfigDir), zap.String("addr", addr))
	return &upstream{
		xdsAddr: addr, caAddr: addr, xdsRoots: func() *x509.CertPool { return roots }, caRoots: func() *x509.CertPool { return roots },
		xdsToken: token, caToken: certmanager.StaticToken(token),
		run: func(ctx context.Context) error { return cp.Run(ctx, lis) },
	}, nil
}

// nodeInfo describes this proxy to the control plane. Outside a pod
// (local mode, tests) POD_NAME, POD_NAMESPACE and INSTANCE_IP may be unset;
// the xDS node id needs them, so they default to ztunnel-<node>,
// istio-system and 127.0.0.1.
func nodeInfo(cfg *config.Config) xds.NodeInfo {
	n := xds.NodeInfo{
		PodName: cfg.PodName, PodNamespace: cfg.PodNamespace, NodeName: cfg.NodeName,
		InstanceIPs: []string{cfg.InstanceIP},
		Metadata:    map[string]string{"CLUSTER_ID": cfg.ClusterID, "NETWORK": cfg.Network},
	}
	if n.PodName == "" {
		n.PodName = "ztunnel-" + cfg.NodeName
	}
	if n.PodNamespace == "" {
		n.PodNamespace = "istio-system"
	}
	if cfg.InstanceIP == "" {
		n.InstanceIPs = []string{"127.0.0.1"}
	}
	return n
}
