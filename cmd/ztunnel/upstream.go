package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// upstream is where the node proxy gets its state and certificates: the
// control plane at XDS_ADDRESS / CA_ADDRESS. The node proxy embeds none; a
// local mesh runs ztunnel-cp beside it (see cmd/ztunnel's doc).
type upstream struct {
	xdsAddr, caAddr string
	// xdsRoots / caRoots return the roots in force (XDS_ROOT_CA,
	// CA_ROOT_CA), asked at every connection so reloads apply.
	// A nil pool means the system roots (RootSystem).
	xdsRoots, caRoots func() *x509.CertPool
	// xdsServerName / caServerName: the names the server certificates
	// must carry; "" means the host of the address.
	xdsServerName, caServerName string
	// xdsTokenFile / caToken: the bearer token (AUTH_TOKEN, re-read on use).
	xdsTokenFile string
	caToken      certmanager.TokenSource
	// watch re-reads the root files until ctx is done; nil when there are
	// none to watch (inline PEM or the system pool).
	watch func(ctx context.Context) error
}

// remoteUpstream reads the roots and token locations of XDS_ADDRESS and
// CA_ADDRESS. Root files are watched (watch) and reloaded on change, as
// Istio's ztunnel does; one file named by both is read once. The server
// certificates are checked against XDSHostname / CAHostname.
func remoteUpstream(cfg *config.Config, log *zap.Logger) (*upstream, error) {
	xdsRoots, xdsFile, err := rootSource(cfg.XDSRootCA, log.With(zap.String("env", config.EnvXDSRootCA)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", config.EnvXDSRootCA, err)
	}
	caRoots, caFile := xdsRoots, xdsFile
	if cfg.CARootCA != cfg.XDSRootCA {
		if caRoots, caFile, err = rootSource(cfg.CARootCA, log.With(zap.String("env", config.EnvCARootCA))); err != nil {
			return nil, fmt.Errorf("%s: %w", config.EnvCARootCA, err)
		}
	}
	var files []*certmanager.RootFile
	for _, f := range []*certmanager.RootFile{xdsFile, caFile} {
		if f != nil && !slices.Contains(files, f) {
			files = append(files, f)
		}
	}
	up := &upstream{
		xdsAddr: cfg.XDSAddress, caAddr: cfg.CAAddress, xdsRoots: xdsRoots, caRoots: caRoots,
		xdsServerName: cfg.XDSHostname, caServerName: cfg.CAHostname,
		xdsTokenFile: cfg.AuthToken, caToken: certmanager.FileToken(cfg.AuthToken),
	}
	if len(files) > 0 {
		up.watch = func(ctx context.Context) error {
			var wg sync.WaitGroup
			for _, f := range files {
				wg.Go(func() { _ = f.Run(ctx, certmanager.DefaultRootPoll) })
			}
			wg.Wait()
			return nil
		}
	}
	return up, nil
}

// rootSource reads an XDS_ROOT_CA / CA_ROOT_CA value: config.RootSystem
// (the system pool: a nil pool), an inline PEM, or a file, returned too so
// it can be watched. Inline PEM that holds no certificate is an error.
func rootSource(v string, log *zap.Logger) (func() *x509.CertPool, *certmanager.RootFile, error) {
	switch {
	case v == config.RootSystem:
		log.Info("root certificates: system pool")
		return func() *x509.CertPool { return nil }, nil, nil
	case strings.Contains(v, "-----BEGIN"):
		pool, n, err := certmanager.ParseRoots([]byte(v))
		if err != nil {
			return nil, nil, fmt.Errorf("inline PEM: %w", err)
		}
		log.Info("root certificates: inline PEM", zap.Int("certificates", n))
		return func() *x509.CertPool { return pool }, nil, nil
	default:
		f, err := certmanager.LoadRootFile(v, log)
		if err != nil {
			return nil, nil, err
		}
		return f.Pool, f, nil
	}
}

// xdsConfig is the xDS client's configuration against up: roots, server
// name, token, XDS_HEADER_* metadata and the node. Log and Registerer are
// left to the caller.
func (up *upstream) xdsConfig(cfg *config.Config, sink xds.Sink) xds.ClientConfig {
	return xds.ClientConfig{
		Address: up.xdsAddr, Roots: up.xdsRoots, ServerName: up.xdsServerName,
		TokenFile: up.xdsTokenFile,
		ClusterID: cfg.ClusterID, Headers: cfg.XDSHeaders, Node: nodeInfo(cfg), Sink: sink,
	}
}

// caConfig is the CA requester's configuration against up: roots, server
// name, token and CA_HEADER_* metadata.
func (up *upstream) caConfig(cfg *config.Config) certmanager.GRPCConfig {
	return certmanager.GRPCConfig{
		Address: up.caAddr, Roots: up.caRoots, ServerName: up.caServerName, Token: up.caToken,
		ClusterID: cfg.ClusterID, Headers: cfg.CAHeaders, TTL: cfg.SecretTTL,
	}
}

// nodeInfo describes this proxy to the control plane: the ISTIO_META_*
// metadata (with ISTIO_VERSION), CLUSTER_ID and NETWORK from the config. Outside a pod
// (a local mesh, tests) POD_NAME, POD_NAMESPACE and INSTANCE_IP may be unset;
// the xDS node id needs them, so they default to ztunnel-<node>,
// istio-system and 127.0.0.1.
func nodeInfo(cfg *config.Config) xds.NodeInfo {
	n := xds.NodeInfo{
		PodName: cfg.PodName, PodNamespace: cfg.PodNamespace, NodeName: cfg.NodeName,
		InstanceIPs: []string{cfg.InstanceIP},
		Metadata:    maps.Clone(cfg.NodeMetadata),
	}
	if n.Metadata == nil {
		n.Metadata = map[string]string{}
	}
	n.Metadata["CLUSTER_ID"], n.Metadata["NETWORK"] = cfg.ClusterID, cfg.Network
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
