// Command ztunnel-cp is ztunnel-go's standalone control plane: in local mode
// it watches a directory of Kubernetes/Istio/Gateway API YAML; in Kubernetes
// mode (--kubeconfig or --in-cluster) it watches the API server, checks
// callers' ServiceAccount tokens with TokenReview and writes ServiceEntry
// status.addresses while it holds a Lease. Either way it serves the
// translated workloads and policies over delta xDS and signs workload
// certificates, both on one TLS gRPC port (Istio's 15012), and writes the
// root certificate to the state directory for node proxies.
//
//	ztunnel-cp --config-dir DIR [--listen 127.0.0.1:15012] [--state-dir DIR]
//	  [--trust-domain cluster.local] [--cluster-id Kubernetes]
//	  [--node-tokens FILE] [--root-cert FILE --root-key FILE] [--admin ADDR]
//	ztunnel-cp (--kubeconfig FILE | --in-cluster) [--trusted-node-accounts istio-system/ztunnel]
//	  [--lease-namespace istio-system] [--lease-name NAME] [other flags as above]
//
// Wiring only; the logic lives in internal/controlplane.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubeauth"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubestatus"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/identity/ca"
)

type options struct {
	configDir, listen, stateDir, admin  string
	trustDomain, clusterID, rootNs      string
	nodeTokens, rootCert, rootKey       string
	enrollFromLabels, externalNameAlias bool
	// Kubernetes mode.
	kubeconfig, leaseNamespace, leaseName string
	trustedNodeAccounts                   string
	inCluster, enrollFromLabelsSet        bool
}

func (o options) kubeMode() bool { return o.kubeconfig != "" || o.inCluster }

func main() {
	var o options
	flag.StringVar(&o.configDir, "config-dir", "", "directory of YAML objects to serve (required)")
	flag.StringVar(&o.listen, "listen", "127.0.0.1:15012", "address of the xDS + CA gRPC (TLS) listener")
	flag.StringVar(&o.stateDir, "state-dir", "ztunnel-cp-state", "directory for root-cert.pem, the generated root key and ServiceEntry address allocations")
	flag.StringVar(&o.admin, "admin", "", "address of an HTTP admin listener serving /config_dump and /metrics (\"\": none)")
	flag.StringVar(&o.trustDomain, "trust-domain", translate.DefaultTrustDomain, "trust domain of workload identities")
	flag.StringVar(&o.clusterID, "cluster-id", translate.DefaultClusterID, "cluster id in workload uids")
	flag.StringVar(&o.rootNs, "root-namespace", translate.DefaultRootNamespace, "namespace of mesh-wide policies")
	flag.StringVar(&o.nodeTokens, "node-tokens", "", "file of \"<node-name> <token>\" lines; node proxies authenticate with \"authorization: Bearer <token>\" (without it every call is refused)")
	flag.StringVar(&o.rootCert, "root-cert", "", "root CA certificate PEM (with --root-key); default: load or create one in the state dir")
	flag.StringVar(&o.rootKey, "root-key", "", "root CA private key PEM")
	flag.BoolVar(&o.enrollFromLabels, "enrollment-from-labels", true, "treat pods matching the ambient enrollment labels as HBONE-enrolled (no node agent annotates them in local mode)")
	flag.BoolVar(&o.externalNameAlias, "external-name-alias", true, "serve ExternalName Services that point at mesh services as DNS aliases")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubernetes mode: read the cluster from the API server with this kubeconfig")
	flag.BoolVar(&o.inCluster, "in-cluster", false, "Kubernetes mode with the pod's own service account (in-cluster configuration)")
	flag.StringVar(&o.trustedNodeAccounts, "trusted-node-accounts", "istio-system/ztunnel", "Kubernetes mode: comma-separated namespace/name ServiceAccounts of node proxies (CA_TRUSTED_NODE_ACCOUNTS)")
	flag.StringVar(&o.leaseNamespace, "lease-namespace", kubestatus.DefaultLeaseNamespace, "Kubernetes mode: namespace of the leader-election Lease for ServiceEntry address writes")
	flag.StringVar(&o.leaseName, "lease-name", kubestatus.DefaultLeaseName, "Kubernetes mode: name of that Lease")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) {
		o.enrollFromLabelsSet = o.enrollFromLabelsSet || f.Name == "enrollment-from-labels"
	})

	log, err := zap.NewProduction()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := run(o, log); err != nil {
		log.Error("ztunnel-cp failed", zap.Error(err))
		os.Exit(1)
	}
}

func run(o options, log *zap.Logger) error {
	switch {
	case o.kubeMode() && o.configDir != "":
		return errors.New("--config-dir (local mode) and --kubeconfig/--in-cluster (Kubernetes mode) exclude each other")
	case !o.kubeMode() && o.configDir == "":
		return errors.New("--config-dir (local mode) or --kubeconfig/--in-cluster (Kubernetes mode) is required")
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
		alloc     *autoalloc.Allocator
		runStatus func(context.Context) error
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
		src, auth, alloc, runStatus = k.src, k.auth, k.alloc, k.status.Run
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
	cp, err := controlplane.New(controlplane.Config{
		Source: src, SourceErrors: srcErrs, Translate: tcfg, Allocator: alloc,
		CA: authority, Auth: auth, Log: log, Registerer: reg,
	})
	if err != nil {
		return err
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
	log.Info("root certificate written", zap.String("path", rootPath))
	if runStatus == nil {
		return cp.Run(ctx, lis)
	}
	statusDone := make(chan error, 1)
	sctx, cancel := context.WithCancel(ctx)
	go func() { statusDone <- runStatus(sctx) }()
	err = cp.Run(ctx, lis)
	cancel()
	return errors.Join(err, <-statusDone)
}

// kubeParts are Kubernetes mode's source, authenticator, allocator and
// ServiceEntry status writer.
type kubeParts struct {
	src    *kube.Source
	auth   *kubeauth.Authenticator
	alloc  *autoalloc.Allocator
	status *kubestatus.Writer
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
	return &kubeParts{src: src, auth: auth, alloc: alloc, status: status}, nil
}

// loadCA: --root-cert/--root-key, else the state dir's root, else a new root
// saved to the state dir (so node proxies keep trusting it after a restart).
func loadCA(o options) (*ca.CA, error) {
	certPath, keyPath := o.rootCert, o.rootKey
	if (certPath == "") != (keyPath == "") {
		return nil, errors.New("--root-cert and --root-key go together")
	}
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
