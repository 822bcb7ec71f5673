// Command ztunnel-cp is ztunnel-go's standalone control plane: in local mode
// it watches a directory of Kubernetes/Istio/Gateway API YAML; in Kubernetes
// mode (--kubeconfig or --in-cluster) it watches the API server, checks
// callers' ServiceAccount tokens with TokenReview (and, for a node proxy,
// the pod's node against the API server), writes ServiceEntry
// status.addresses while it holds a Lease (leader election always runs in
// this mode), and publishes the root certificate as ConfigMap
// istio-ca-root-cert (key root-cert.pem) in --system-namespace for node
// proxies to mount. Either way it serves the translated workloads and
// policies over delta xDS and signs workload certificates, both on one TLS
// gRPC port (Istio's 15012), and writes the root certificate to the state
// directory.
//
//	ztunnel-cp --config-dir DIR [--listen 127.0.0.1:15012] [--state-dir DIR]
//	  [--trust-domain cluster.local] [--cluster-id Kubernetes]
//	  [--node-tokens FILE] [--root-cert FILE --root-key FILE] [--admin ADDR]
//	  [--readiness-addr ADDR] [--log-level info] [--check-flags]
//	ztunnel-cp (--kubeconfig FILE | --in-cluster) [--trusted-node-accounts istio-system/ztunnel]
//	  [--system-namespace istio-system] [--lease-namespace istio-system]
//	  [--lease-name NAME] [other flags as above]
//
// --system-namespace is the namespace the control plane runs in (the
// chart's release namespace): the root-certificate ConfigMap goes there and
// the serving certificate also covers its Service, ztunnel-cp.<ns>.svc. It
// does not set the Lease namespace, the trusted node accounts or the root
// namespace, which have their own flags.
//
// --check-flags parses and validates the flags, prints what they amount to
// as one JSON object and exits without reading files or contacting
// anything: deploy's tests run it with the chart's arguments.
//
// Wiring only; the logic lives in internal/controlplane.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubeauth"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubestatus"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

type options struct {
	configDir, listen, stateDir, admin  string
	readinessAddr, logLevel             string
	trustDomain, clusterID, rootNs      string
	nodeTokens, rootCert, rootKey       string
	enrollFromLabels, externalNameAlias bool
	checkFlags                          bool
	// Kubernetes mode.
	kubeconfig, leaseNamespace, leaseName string
	trustedNodeAccounts, systemNamespace  string
	inCluster, enrollFromLabelsSet        bool
}

func (o options) kubeMode() bool { return o.kubeconfig != "" || o.inCluster }

// serviceName is the chart's Service in front of the replicas; node proxies
// dial ztunnel-cp.<system namespace>.svc:15012.
const serviceName = "ztunnel-cp"

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ztunnel-cp:", err)
		os.Exit(2)
	}
	if o.checkFlags {
		if err := json.NewEncoder(os.Stdout).Encode(o.summary()); err != nil {
			os.Exit(1)
		}
		return
	}
	log, err := newLogger(o.logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ztunnel-cp:", err)
		os.Exit(2)
	}
	if err := run(o, log); err != nil {
		log.Error("ztunnel-cp failed", zap.Error(err))
		_ = log.Sync()
		os.Exit(1)
	}
	_ = log.Sync()
}

// parseFlags parses and validates args (without the program name). Usage
// and flag errors go to stderr.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("ztunnel-cp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.configDir, "config-dir", "", "local mode: directory of YAML objects to serve")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:15012", "address of the xDS + CA gRPC (TLS) listener")
	fs.StringVar(&o.stateDir, "state-dir", "ztunnel-cp-state", "directory for root-cert.pem, the generated root key and ServiceEntry address allocations")
	fs.StringVar(&o.admin, "admin", "", "address of an HTTP admin listener serving /config_dump and /metrics (\"\": none)")
	fs.StringVar(&o.readinessAddr, "readiness-addr", "", "address of an HTTP listener serving "+readinessPath+": 200 once the first translation is pushed (and, in Kubernetes mode, the root certificate ConfigMap is published), else 503 (\"\": none)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.checkFlags, "check-flags", false, "validate the flags, print their effect as JSON and exit without starting anything")
	fs.StringVar(&o.trustDomain, "trust-domain", translate.DefaultTrustDomain, "trust domain of workload identities")
	fs.StringVar(&o.clusterID, "cluster-id", translate.DefaultClusterID, "cluster id in workload uids")
	fs.StringVar(&o.rootNs, "root-namespace", translate.DefaultRootNamespace, "namespace of mesh-wide policies")
	fs.StringVar(&o.nodeTokens, "node-tokens", "", "local mode: file of \"<node-name> <token>\" lines; node proxies authenticate with \"authorization: Bearer <token>\" (without it every call is refused)")
	fs.StringVar(&o.rootCert, "root-cert", "", "root CA certificate PEM (with --root-key); default: load or create one in the state dir")
	fs.StringVar(&o.rootKey, "root-key", "", "root CA private key PEM")
	fs.BoolVar(&o.enrollFromLabels, "enrollment-from-labels", true, "treat pods matching the ambient enrollment labels as HBONE-enrolled (default false in Kubernetes mode, where the node agent annotates them)")
	fs.BoolVar(&o.externalNameAlias, "external-name-alias", true, "serve ExternalName Services that point at mesh services as DNS aliases")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubernetes mode: read the cluster from the API server with this kubeconfig")
	fs.BoolVar(&o.inCluster, "in-cluster", false, "Kubernetes mode with the pod's own service account (in-cluster configuration)")
	fs.StringVar(&o.trustedNodeAccounts, "trusted-node-accounts", "istio-system/ztunnel", "Kubernetes mode: comma-separated namespace/name ServiceAccounts of node proxies (CA_TRUSTED_NODE_ACCOUNTS)")
	fs.StringVar(&o.systemNamespace, "system-namespace", "istio-system", "Kubernetes mode: the namespace this control plane runs in: it publishes ConfigMap "+rootConfigMapName+" there, and its serving certificate covers "+serviceName+".<namespace>.svc")
	fs.StringVar(&o.leaseNamespace, "lease-namespace", kubestatus.DefaultLeaseNamespace, "Kubernetes mode: namespace of the leader-election Lease for ServiceEntry address writes")
	fs.StringVar(&o.leaseName, "lease-name", kubestatus.DefaultLeaseName, "Kubernetes mode: name of that Lease")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) {
		o.enrollFromLabelsSet = o.enrollFromLabelsSet || f.Name == "enrollment-from-labels"
	})
	return o, o.validate()
}

// validate checks what can be checked without files or the network.
func (o options) validate() error {
	switch {
	case o.kubeMode() && o.configDir != "":
		return errors.New("--config-dir (local mode) and --kubeconfig/--in-cluster (Kubernetes mode) exclude each other")
	case !o.kubeMode() && o.configDir == "":
		return errors.New("--config-dir (local mode) or --kubeconfig/--in-cluster (Kubernetes mode) is required")
	case (o.rootCert == "") != (o.rootKey == ""):
		return errors.New("--root-cert and --root-key go together")
	case o.kubeMode() && o.systemNamespace == "":
		return errors.New("--system-namespace must not be empty in Kubernetes mode")
	}
	if _, err := zap.ParseAtomicLevel(o.logLevel); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if _, err := kubeauth.ParseAccounts(o.trustedNodeAccounts); err != nil {
		return fmt.Errorf("--trusted-node-accounts: %w", err)
	}
	for _, a := range []struct{ flag, addr string }{{"listen", o.listen}, {"admin", o.admin}, {"readiness-addr", o.readinessAddr}} {
		if a.addr == "" && a.flag != "listen" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return fmt.Errorf("--%s: %w", a.flag, err)
		}
	}
	return nil
}

// summary is what --check-flags prints: the flags' effect as a deployment
// sees it.
type summary struct {
	Mode          string   `json:"mode"` // "local" or "kubernetes"
	Listen        string   `json:"listen"`
	Admin         string   `json:"admin,omitempty"`
	ReadinessAddr string   `json:"readiness_addr,omitempty"`
	ReadinessPath string   `json:"readiness_path,omitempty"`
	ServingNames  []string `json:"serving_names"`
	// Kubernetes mode.
	RootConfigMap       string   `json:"root_configmap,omitempty"` // namespace/name
	RootConfigMapKey    string   `json:"root_configmap_key,omitempty"`
	TrustedNodeAccounts []string `json:"trusted_node_accounts,omitempty"`
	Lease               string   `json:"lease,omitempty"` // namespace/name
}

func (o options) summary() summary {
	s := summary{Mode: "local", Listen: o.listen, Admin: o.admin, ServingNames: o.servingNames()}
	if s.ServingNames == nil {
		s.ServingNames = caserver.DefaultServingNames(o.rootNs) // plus the listener's IP, if specific
	}
	if o.readinessAddr != "" {
		s.ReadinessAddr, s.ReadinessPath = o.readinessAddr, readinessPath
	}
	if o.kubeMode() {
		s.Mode = "kubernetes"
		s.RootConfigMap, s.RootConfigMapKey = o.systemNamespace+"/"+rootConfigMapName, rootConfigMapKey
		s.TrustedNodeAccounts, _ = kubeauth.ParseAccounts(o.trustedNodeAccounts)
		s.Lease = o.leaseNamespace + "/" + o.leaseName
	}
	return s
}

// servingNames: nil in local mode (the control plane's defaults plus the
// listener's IP); in Kubernetes mode the defaults, the Service's names and
// the listener's IP when it is a specific one.
func (o options) servingNames() []string {
	if !o.kubeMode() {
		return nil
	}
	svc := serviceName + "." + o.systemNamespace + ".svc"
	names := append(caserver.DefaultServingNames(o.rootNs), svc, svc+".cluster.local")
	if host, _, err := net.SplitHostPort(o.listen); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() && !slices.Contains(names, ip.String()) {
			names = append(names, ip.String())
		}
	}
	return names
}

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zap.ParseAtomicLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = lvl
	return cfg.Build()
}

func run(o options, log *zap.Logger) error {
	if err := o.validate(); err != nil {
		return err
	}
	log.Info("starting", zap.Any("options", o))
	if err := os.MkdirAll(o.stateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	authority, err := loadCA(o)
	if err != nil {
		return err
	}
	rootPath := filepath.Join(o.stateDir, "root-cert.pem")
	if err := os.WriteFile(rootPath, authority.RootPEM(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", rootPath, err)
	}
	reg := prometheus.NewRegistry()
	tcfg := translate.Config{
		ClusterID: o.clusterID, TrustDomain: o.trustDomain, RootNamespace: o.rootNs,
		EnrollmentFromLabels: o.enrollFromLabels, EnableExternalNameAlias: o.externalNameAlias,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var (
		src       cluster.Source
		srcErrs   func() []error
		auth      caserver.Authenticator
		placement *kubeauth.Placement
		alloc     *autoalloc.Allocator
		// background runs beside the control plane until it stops.
		background []func(context.Context) error
		// ready gates readiness besides the first translation.
		ready = func() bool { return true }
	)
	if o.kubeMode() {
		if !o.enrollFromLabelsSet {
			// The node agent writes ambient.istio.io/redirection; istiod
			// keys off it alone.
			tcfg.EnrollmentFromLabels = false
		}
		k, err := kubeWiring(o, log)
		if err != nil {
			return err
		}
		src, auth, alloc, placement = k.src, k.auth, k.alloc, k.placement
		rp := &rootPublisher{Client: k.kube, Namespace: o.systemNamespace, RootPEM: authority.RootPEM(), Log: log.Named("root-configmap")}
		background = append(background, k.status.Run, func(ctx context.Context) error { rp.Run(ctx); return nil })
		ready = rp.Published
	} else {
		tokens := map[string]string{}
		if o.nodeTokens != "" {
			data, err := os.ReadFile(o.nodeTokens)
			if err != nil {
				return fmt.Errorf("node tokens: %w", err)
			}
			if tokens, err = caserver.ParseNodeTokens(data); err != nil {
				return err
			}
		} else {
			log.Warn("no --node-tokens: every xDS and certificate request will be refused")
		}
		nt, err := caserver.NewNodeTokens(tokens)
		if err != nil {
			return err
		}
		auth = nt
		if alloc, err = autoalloc.New(autoalloc.Config{Store: autoalloc.FileStore{Path: filepath.Join(o.stateDir, autoalloc.DefaultFileName)}}); err != nil {
			return err
		}
		ls := local.New(o.configDir, log.Named("source"), 0)
		src, srcErrs = ls, ls.Errors
	}
	cfg := controlplane.Config{
		Source: src, SourceErrors: srcErrs, Translate: tcfg, Allocator: alloc,
		CA: authority, Auth: auth, ServingNames: o.servingNames(), Log: log, Registerer: reg,
	}
	if placement != nil { // a nil *kubeauth.Placement must not become a non-nil interface
		cfg.Placement = placement
	}
	cp, err := controlplane.New(cfg)
	if err != nil {
		return err
	}
	if placement != nil {
		// Set before Run serves anything: the API server is asked only
		// when the latest translation does not know the pod.
		placement.Cached = cp.CachedPlacement()
	}
	lis, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", o.listen, err)
	}
	if o.admin != "" {
		srv, err := serveAdmin(o.admin, cp, reg, log)
		if err != nil {
			lis.Close()
			return err
		}
		defer srv.Close()
	}
	if o.readinessAddr != "" {
		srv, err := serveReadiness(o.readinessAddr, readyFunc(cp.Synced(), ready), log)
		if err != nil {
			lis.Close()
			return err
		}
		defer srv.Close()
	}
	log.Info("root certificate written", zap.String("path", rootPath))
	if len(background) == 0 {
		return cp.Run(ctx, lis)
	}
	bctx, cancel := context.WithCancel(ctx)
	errs := make(chan error, len(background))
	for _, f := range background {
		go func() { errs <- f(bctx) }()
	}
	err = cp.Run(ctx, lis)
	cancel()
	for range background {
		err = errors.Join(err, <-errs)
	}
	return err
}

// readinessPath is what --readiness-addr serves (the path Istio's probes use).
const readinessPath = "/healthz/ready"

// readyFunc: synced is closed and more() holds.
func readyFunc(synced <-chan struct{}, more func() bool) func() bool {
	return func() bool {
		select {
		case <-synced:
			return more()
		default:
			return false
		}
	}
}

// serveReadiness serves readinessPath on addr: 200 when ready(), else 503.
func serveReadiness(addr string, ready func() bool, log *zap.Logger) (*http.Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("readiness listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: readinessHandler(ready), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("readiness server", zap.Error(err))
		}
	}()
	log.Info("readiness listening", zap.Stringer("addr", lis.Addr()))
	return srv, nil
}

func readinessHandler(ready func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+readinessPath, func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}

// kubeParts are Kubernetes mode's source, authenticator, live placement,
// allocator, ServiceEntry status writer and core client.
type kubeParts struct {
	src       *kube.Source
	auth      *kubeauth.Authenticator
	placement *kubeauth.Placement
	alloc     *autoalloc.Allocator
	status    *kubestatus.Writer
	kube      kubernetes.Interface
}

func kubeWiring(o options, log *zap.Logger) (*kubeParts, error) {
	rc, err := kube.RESTConfig(o.kubeconfig)
	if err != nil {
		return nil, err
	}
	clients, err := kube.NewClients(rc)
	if err != nil {
		return nil, err
	}
	src, err := kube.New(kube.Config{Clients: clients, Log: log.Named("source")})
	if err != nil {
		return nil, err
	}
	trusted, err := kubeauth.ParseAccounts(o.trustedNodeAccounts)
	if err != nil {
		return nil, err
	}
	if trusted == nil {
		trusted = []string{}
	}
	auth, err := kubeauth.New(kubeauth.Config{Client: clients.Kube, TrustedNodeAccounts: trusted, Log: log.Named("auth")})
	if err != nil {
		return nil, err
	}
	status, err := kubestatus.New(kubestatus.Config{
		Istio: clients.Istio, Kube: clients.Kube, Source: src,
		LeaseNamespace: o.leaseNamespace, LeaseName: o.leaseName, Log: log.Named("se-status"),
	})
	if err != nil {
		return nil, err
	}
	alloc, err := autoalloc.New(autoalloc.Config{Store: status})
	if err != nil {
		return nil, err
	}
	return &kubeParts{
		src: src, auth: auth, alloc: alloc, status: status, kube: clients.Kube,
		placement: &kubeauth.Placement{Client: clients.Kube, Log: log.Named("placement")},
	}, nil
}

// loadCA: --root-cert/--root-key, else the state dir's root, else a new root
// saved to the state dir (so node proxies keep trusting it after a restart).
func loadCA(o options) (*ca.CA, error) {
	certPath, keyPath := o.rootCert, o.rootKey
	generated := false
	if certPath == "" {
		certPath, keyPath = filepath.Join(o.stateDir, "root-cert.pem"), filepath.Join(o.stateDir, "root-key.pem")
		if _, err := os.Stat(keyPath); errors.Is(err, fs.ErrNotExist) {
			generated = true
		}
	}
	opts := ca.Options{TrustDomain: o.trustDomain}
	if !generated {
		var err error
		if opts.RootCertPEM, err = os.ReadFile(certPath); err != nil {
			return nil, fmt.Errorf("root cert: %w", err)
		}
		if opts.RootKeyPEM, err = os.ReadFile(keyPath); err != nil {
			return nil, fmt.Errorf("root key: %w", err)
		}
	}
	authority, err := ca.New(opts)
	if err != nil {
		return nil, err
	}
	if generated {
		key, err := authority.RootKeyPEM()
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(keyPath, key, 0o600); err != nil {
			return nil, fmt.Errorf("save root key: %w", err)
		}
	}
	return authority, nil
}

func serveAdmin(addr string, cp *controlplane.ControlPlane, reg *prometheus.Registry, log *zap.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/config_dump", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(cp.ConfigDump())
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server", zap.Error(err))
		}
	}()
	log.Info("admin listening", zap.Stringer("addr", lis.Addr()))
	return srv, nil
}
