// Package bootstrap assembles the standalone control plane that cmd/ztunnel-cp
// runs, from its Options: the CA (from files, or a root kept in the state
// directory), the cluster source and caller authentication of local mode (a
// directory of YAML, node tokens) or Kubernetes mode (the API server,
// TokenReview, live pod placement, the ServiceEntry status writer and the
// root-certificate ConfigMap publisher, the validating admission webhook),
// the TLS gRPC listener, and the HTTP servers: debug (/config_dump,
// /metrics, /logging, pprof; loopback only), metrics and readiness
// (internal/daemon).
//
// It holds no control-plane logic of its own: translation, xDS and the CA
// live in internal/controlplane and its other packages.
package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/jwks"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubeauth"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/multicluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// ServiceName is the chart's Service in front of the replicas; node proxies
// dial ztunnel-cp.<system namespace>.svc:15012.
const ServiceName = "ztunnel-cp"

// Default addresses of the HTTP servers. The debug server is loopback only;
// metrics and readiness carry nothing else and listen on every address, on
// ports that do not collide with a node proxy's (15000, 15020, 15021) or a
// node agent's (8000, 8001) on the same host.
const (
	DefaultAdminAddr     = "localhost:15014"
	DefaultMetricsAddr   = ":15015"
	DefaultReadinessAddr = ":15016"
)

// Options are ztunnel-cp's flags (see cmd/ztunnel-cp for each one's meaning).
type Options struct {
	ConfigDir, Listen, StateDir           string
	AdminAddr, MetricsAddr, ReadinessAddr string // "" disables that server
	TrustDomain, ClusterID, RootNamespace string
	NodeTokens, RootCert, RootKey         string
	EnrollmentFromLabels                  bool
	ExternalNameAlias                     bool
	// PathNormalization is meshConfig pathNormalization.normalization
	// (NONE, BASE, MERGE_SLASHES, DECODE_AND_MERGE_SLASHES; "": BASE).
	PathNormalization string
	// JWKS fetch limits (jwks.Config): http allowed, internal addresses
	// allowed, and the cluster's ranges (comma-separated CIDRs).
	JWKSAllowHTTP, JWKSAllowInternal bool
	JWKSInternalCIDRs                string
	// MeshConfig is an Istio MeshConfig file (LoadMeshConfig); "" means
	// Istio's defaults (everything exported everywhere).
	MeshConfig string
	// Kubernetes mode.
	Kubeconfig          string
	InCluster           bool
	TrustedNodeAccounts string // comma-separated namespace/name
	SystemNamespace     string
	LeaseNamespace      string
	LeaseName           string
	// WebhookAddr serves the validating admission webhook (HTTPS) in
	// Kubernetes mode; "" disables it.
	WebhookAddr string
	// WaypointImage, in Kubernetes mode, deploys a waypoint of that image
	// for every Gateway of class istio-waypoint (waypointctl); "" leaves
	// waypoints to someone else.
	WaypointImage string
	// WaypointTemplate and WaypointValues, if set, are the waypoint
	// Deployment template and its values (waypointctl.Template); "": the
	// built-in Deployment.
	WaypointTemplate, WaypointValues string
	// Network is this cluster's network (translate.Config.Network); "":
	// the label topology.istio.io/network of the root namespace.
	Network string
	// Multicluster, in Kubernetes mode, reads the remote clusters that
	// Istio remote secrets in SystemNamespace name and merges their
	// workloads (internal/controlplane/multicluster).
	Multicluster bool
	// RemoteStaleAfter is how long a remote cluster that cannot be read
	// keeps its last objects (0: multicluster.DefaultStaleAfter).
	RemoteStaleAfter time.Duration
	// WaypointCRLFile, if set, holds the CRLs the node proxies enforce
	// (the chart's ztunnel.peerCaCrl, mounted here too): it is read on every
	// reconcile and handed to each waypoint (waypointctl.Config.CRLPEM).
	WaypointCRLFile string
}

// translateConfig is the translation's configuration from the flags.
func translateConfig(o Options) translate.Config {
	return translate.Config{
		ClusterID: o.ClusterID, Network: o.Network, TrustDomain: o.TrustDomain, RootNamespace: o.RootNamespace,
		EnrollmentFromLabels: o.EnrollmentFromLabels, EnableExternalNameAlias: o.ExternalNameAlias,
		PathNormalization: pathNormalization(o.PathNormalization),
	}
}

// jwksCIDRs parses JWKSInternalCIDRs.
func (o Options) jwksCIDRs() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(o.JWKSInternalCIDRs, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--jwks-internal-cidrs: %w", err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// KubeMode: the cluster comes from the API server.
func (o Options) KubeMode() bool { return o.Kubeconfig != "" || o.InCluster }

// Validate checks what can be checked without files or the network.
func (o Options) Validate() error {
	if _, ok := waypointapi.PathNormalization_value["PATH_NORMALIZATION_"+o.PathNormalization]; !ok && o.PathNormalization != "" {
		return fmt.Errorf("--path-normalization: unknown %q (NONE, BASE, MERGE_SLASHES, DECODE_AND_MERGE_SLASHES)", o.PathNormalization)
	}
	switch {
	case o.KubeMode() && o.ConfigDir != "":
		return errors.New("--config-dir (local mode) and --kubeconfig/--in-cluster (Kubernetes mode) exclude each other")
	case !o.KubeMode() && o.ConfigDir == "":
		return errors.New("--config-dir (local mode) or --kubeconfig/--in-cluster (Kubernetes mode) is required")
	case (o.RootCert == "") != (o.RootKey == ""):
		return errors.New("--root-cert and --root-key go together")
	case o.KubeMode() && o.SystemNamespace == "":
		return errors.New("--system-namespace must not be empty in Kubernetes mode")
	case o.WaypointTemplate != "" && o.WaypointImage == "":
		return errors.New("--waypoint-template needs --waypoint-image (the waypoint controller)")
	case o.WaypointValues != "" && o.WaypointTemplate == "":
		return errors.New("--waypoint-values needs --waypoint-template")
	case o.WaypointCRLFile != "" && o.WaypointImage == "":
		return errors.New("--waypoint-crl-file needs --waypoint-image (the waypoint controller)")
	case o.RemoteStaleAfter < 0:
		return errors.New("--remote-stale-after must not be negative")
	}
	if _, err := o.jwksCIDRs(); err != nil {
		return err
	}
	if _, err := kubeauth.ParseAccounts(o.TrustedNodeAccounts); err != nil {
		return fmt.Errorf("--trusted-node-accounts: %w", err)
	}
	if _, _, err := net.SplitHostPort(o.Listen); err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	for _, a := range []struct {
		flag, addr string
		debug      bool
	}{{"admin", o.AdminAddr, true}, {"metrics-addr", o.MetricsAddr, false}, {"readiness-addr", o.ReadinessAddr, false},
		{"webhook-addr", o.WebhookAddr, false}} {
		if a.addr == "" {
			continue
		}
		if err := daemon.ValidateAddr(a.addr, a.debug); err != nil {
			return fmt.Errorf("--%s: %w", a.flag, err)
		}
	}
	return nil
}

// ServingNames are the names the serving certificate covers: nil in local
// mode (the control plane's defaults plus the listener's IP); in Kubernetes
// mode the defaults, the Service's names and the listener's IP when it is a
// specific one.
func (o Options) ServingNames() []string {
	if !o.KubeMode() {
		return nil
	}
	svc := ServiceName + "." + o.SystemNamespace + ".svc"
	names := append(caserver.DefaultServingNames(o.RootNamespace), svc, svc+".cluster.local")
	if host, _, err := net.SplitHostPort(o.Listen); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() && !slices.Contains(names, ip.String()) {
			names = append(names, ip.String())
		}
	}
	return names
}

// Readiness task names.
const (
	TaskTranslation   = "first translation pushed"
	TaskRootConfigMap = "root certificate ConfigMap published"
	// TaskRemoteClusters is ready once every remote cluster was read (or
	// multicluster.DefaultSyncTimeout passed).
	TaskRemoteClusters = "remote clusters read"
)

// Run serves until ctx is done. level is the logger's, for /logging.
func Run(ctx context.Context, o Options, log *zap.Logger, level zap.AtomicLevel) error {
	if err := o.Validate(); err != nil {
		return err
	}
	log.Info("starting", zap.String("version", daemon.Version()), zap.Any("options", o))
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	authority, err := loadCA(o)
	if err != nil {
		return err
	}
	rootPath := filepath.Join(o.StateDir, "root-cert.pem")
	if err := os.WriteFile(rootPath, authority.RootPEM(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", rootPath, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg := controlplane.Config{
		Translate: translateConfig(o),
		CA:        authority, ServingNames: o.ServingNames(), Log: log, Registerer: reg,
	}
	if o.MeshConfig != "" {
		if err := LoadMeshConfig(o.MeshConfig, &cfg.Translate); err != nil {
			return err
		}
		if o.PathNormalization != "" { // the flag wins over the file
			cfg.Translate.PathNormalization = pathNormalization(o.PathNormalization)
		}
		log.Info("mesh config", zap.Strings("defaultServiceExportTo", cfg.Translate.DefaultServiceExportTo),
			zap.Stringer("serviceEntryVisibility", cfg.Translate.ServiceEntryVisibility),
			zap.Int("extensionProviders", len(cfg.Translate.Telemetry.Providers)))
		for _, p := range cfg.Translate.MeshProblems {
			log.Warn("mesh config: not implemented", zap.String("problem", p))
		}
	}
	// RequestAuthentication key sets named by jwksUri (or found by OpenID
	// discovery) are fetched here and sent to the waypoints inline, as
	// istiod does; until a fetch succeeds that issuer's tokens get 401.
	cidrs, err := o.jwksCIDRs()
	if err != nil {
		return err
	}
	var clusterAddrs atomic.Pointer[func(netip.Addr) bool]
	keys := jwks.New(jwks.Config{Log: log.Named("jwks"), AllowHTTP: o.JWKSAllowHTTP, AllowInternal: o.JWKSAllowInternal,
		InternalCIDRs: cidrs, Internal: func(a netip.Addr) bool {
			f := clusterAddrs.Load()
			return f != nil && (*f)(a)
		}})
	// The retry loops of the Kubernetes writers, listed on the readiness
	// page below its first line.
	retries := backoff.NewSet(log)
	cfg.Translate.JWKS = keys
	var (
		k *kubeParts
		// tasks run beside the control plane, as daemon.Group tasks.
		tasks = []cpTask{{name: "jwks fetcher", run: func(ctx context.Context) error { keys.Run(ctx); return nil }}}
	)
	if o.KubeMode() {
		if k, err = kubeWiring(o, log, retries); err != nil {
			return err
		}
		cfg.Source, cfg.Auth, cfg.Allocator, cfg.Placement = k.src, k.auth, k.alloc, k.placement
		k.root.RootPEM = authority.RootPEM()
		cfg.PolicyStatus = k.istio.Update
		tasks = append(tasks, cpTask{name: "status writer", run: k.status.Run},
			cpTask{name: "istio status writer", run: k.istio.Run},
			cpTask{name: "route status writer", run: k.routes.Run},
			cpTask{name: TaskRootConfigMap, run: func(ctx context.Context) error { k.root.Run(ctx); return nil }, ready: k.root.Published})
		if o.WaypointImage != "" {
			wc, err := waypointController(o, k, authority.RootPEM(), log)
			if err != nil {
				return err
			}
			tasks = append(tasks, cpTask{name: "waypoint controller", run: wc.Run})
		}
		if o.Multicluster {
			mc, err := multicluster.New(multicluster.Config{Kube: k.kube, Namespace: o.SystemNamespace, ClusterID: o.ClusterID,
				StaleAfter: o.RemoteStaleAfter, Log: log.Named("multicluster")})
			if err != nil {
				return err
			}
			cfg.Remotes = mc
			tasks = append(tasks, cpTask{name: TaskRemoteClusters, run: mc.Run, ready: mc.Ready})
		}
		if o.WebhookAddr != "" {
			ws, err := webhookServer(o, authority, k.kube, log, retries)
			if err != nil {
				return err
			}
			tasks = append(tasks, cpTask{name: "webhook server", run: ws.Run})
		}
	} else if err := localWiring(o, log, &cfg); err != nil {
		return err
	}
	held := heldByCluster(cfg.Source)
	clusterAddrs.Store(&held)
	cp, err := controlplane.New(cfg)
	if err != nil {
		return err
	}
	if k != nil {
		// Set before Run serves anything: the API server is asked only
		// when the latest translation does not know the pod.
		k.placement.Cached = cp.CachedPlacement()
	}
	lis, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.Listen, err)
	}
	// Every goroutine is a task of g, stopped in the reverse order of its
	// start: the xDS and CA server first, then the HTTP servers, then what
	// feeds the translation.
	g := daemon.NewGroup(ctx, log)
	g.Readiness().ShowRetries(retries)
	servers, err := daemon.Listen(log, Servers(o, cp, reg, level, g.Readiness())...)
	if err != nil {
		lis.Close()
		g.Stop()
		return errors.Join(err, g.Wait())
	}
	for _, t := range tasks {
		var opts []daemon.TaskOption
		if t.ready != nil {
			opts = append(opts, daemon.ReadyWhen(t.ready))
		}
		g.Go(t.name, t.run, opts...)
	}
	g.Go("http servers", servers.Serve)
	log.Info("root certificate written", zap.String("path", rootPath))
	g.Go(TaskTranslation, func(ctx context.Context) error { return cp.Run(ctx, lis) }, daemon.ReadyWhen(daemon.Closed(cp.Synced())))
	return g.Wait()
}

// cpTask is a task of the control plane's daemon.Group; ready, if set, is
// its readiness condition.
type cpTask struct {
	name  string
	run   func(context.Context) error
	ready func() bool
}

// localWiring fills cfg's source, authenticator and allocator for local
// mode: the YAML directory, the node tokens file (without one every call
// is refused) and allocations kept in the state directory.
func localWiring(o Options, log *zap.Logger, cfg *controlplane.Config) error {
	tokens := map[string]string{}
	if o.NodeTokens != "" {
		data, err := os.ReadFile(o.NodeTokens)
		if err != nil {
			return fmt.Errorf("node tokens: %w", err)
		}
		if tokens, err = caserver.ParseNodeTokens(data); err != nil {
			return err
		}
	} else {
		log.Warn("no --node-tokens: every xDS and certificate request will be refused")
	}
	auth, err := caserver.NewNodeTokens(tokens)
	if err != nil {
		return err
	}
	alloc, err := autoalloc.New(autoalloc.Config{Store: autoalloc.FileStore{Path: filepath.Join(o.StateDir, autoalloc.DefaultFileName)}})
	if err != nil {
		return err
	}
	ls := local.New(o.ConfigDir, log.Named("source"), 0)
	cfg.Source, cfg.SourceErrors, cfg.Auth, cfg.Allocator = ls, ls.Errors, auth, alloc
	return nil
}

// pathNormalization converts a validated --path-normalization value ("":
// the default, BASE).
func pathNormalization(s string) waypointapi.PathNormalization {
	return waypointapi.PathNormalization(waypointapi.PathNormalization_value["PATH_NORMALIZATION_"+s])
}

// heldByCluster reports whether an address is a pod's or a Service's in
// the source's latest set: a key fetch must not reach into the cluster
// (jwks.Config.Internal). It scans on every call; fetches are rare.
func heldByCluster(src cluster.Source) func(netip.Addr) bool {
	return func(a netip.Addr) bool {
		objs, _ := src.Current()
		if objs == nil {
			return false
		}
		is := func(s string) bool {
			b, err := netip.ParseAddr(s)
			return err == nil && b.Unmap() == a
		}
		for _, p := range objs.Pods {
			for _, ip := range p.Status.PodIPs {
				if is(ip.IP) {
					return true
				}
			}
			if is(p.Status.HostIP) {
				return true
			}
		}
		for _, s := range objs.Services {
			for _, ip := range s.Spec.ClusterIPs {
				if is(ip) {
					return true
				}
			}
		}
		return false
	}
}
