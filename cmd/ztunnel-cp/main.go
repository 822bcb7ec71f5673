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
//	  [--node-tokens FILE] [--root-cert FILE --root-key FILE]
//	  [--admin localhost:15014] [--metrics-addr :15015] [--readiness-addr :15016]
//	  [--log-level info] [--log-format json] [--check-flags]
//	ztunnel-cp (--kubeconfig FILE | --in-cluster) [--trusted-node-accounts istio-system/ztunnel]
//	  [--system-namespace istio-system] [--lease-namespace istio-system]
//	  [--lease-name NAME] [other flags as above]
//
// The debug server (--admin: /config_dump, /metrics, /logging, pprof) binds
// loopback only; reach it with kubectl port-forward. Metrics and readiness
// (/healthz/ready: 200 once the first translation is pushed and, in
// Kubernetes mode, the root ConfigMap is published and the remote clusters
// were read or 30 s passed, else 503) serve nothing else and may listen on
// the pod IP.
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
// Wiring only; the assembly lives in internal/controlplane/bootstrap, the
// logic in internal/controlplane.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/bootstrap"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubeauth"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubestatus"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/multicluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/webhook"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

type options struct {
	bootstrap.Options
	log        daemon.LogFlags
	checkFlags bool
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	daemon.ExitOnFlagError("ztunnel-cp", err)
	if o.checkFlags {
		if err := daemon.PrintCheck(os.Stdout, o.summary()); err != nil {
			os.Exit(1)
		}
		return
	}
	lc, _ := o.log.Config() // validated by parseFlags
	log, level, err := daemon.NewLogger(lc)
	daemon.ExitOnFlagError("ztunnel-cp", err)
	ctx, stop := daemon.SignalContext()
	defer stop()
	daemon.Exit(log, "ztunnel-cp", bootstrap.Run(ctx, o.Options, log, level))
}

// parseFlags parses and validates args (without the program name). Usage
// and flag errors go to stderr.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("ztunnel-cp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.ConfigDir, "config-dir", "", "local mode: directory of YAML objects to serve")
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:15012", "address of the xDS + CA gRPC (TLS) listener")
	fs.StringVar(&o.StateDir, "state-dir", "ztunnel-cp-state", "directory for root-cert.pem, the generated root key and ServiceEntry address allocations")
	fs.StringVar(&o.AdminAddr, "admin", bootstrap.DefaultAdminAddr, "loopback address of the debug server: /config_dump, /metrics, /logging, /debug/pprof/ (\"\": none; other addresses are refused)")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", bootstrap.DefaultMetricsAddr, "address of the Prometheus /metrics server (\"\": none)")
	fs.StringVar(&o.ReadinessAddr, "readiness-addr", bootstrap.DefaultReadinessAddr, "address of the readiness server, "+daemon.ReadyPath+": 200 once the first translation is pushed (and, in Kubernetes mode, the root certificate ConfigMap is published and the remote clusters were read or 30 s passed), else 503 (\"\": none)")
	o.log.Register(fs, "", "")
	fs.BoolVar(&o.checkFlags, "check-flags", false, "validate the flags, print their effect as JSON and exit without starting anything")
	fs.StringVar(&o.TrustDomain, "trust-domain", translate.DefaultTrustDomain, "trust domain of workload identities")
	fs.StringVar(&o.ClusterID, "cluster-id", translate.DefaultClusterID, "cluster id in workload uids")
	fs.StringVar(&o.Network, "network", "", "this cluster's network (Istio's NETWORK): the default network of its workloads (\"\": the label topology.istio.io/network of the root namespace, else none)")
	fs.BoolVar(&o.Multicluster, "multicluster", true, "Kubernetes mode: read the remote clusters named by Istio remote secrets (label "+multicluster.SecretLabel+"=true in --system-namespace, as istioctl create-remote-secret writes them) and merge their workloads into global services (istio.io/global or meshConfig serviceScopeConfigs)")
	fs.DurationVar(&o.RemoteStaleAfter, "remote-stale-after", multicluster.DefaultStaleAfter, "how long a remote cluster whose API server cannot be read (unreachable, credentials refused) keeps its last workloads before they are dropped")
	fs.StringVar(&o.RootNamespace, "root-namespace", translate.DefaultRootNamespace, "namespace of mesh-wide policies")
	fs.StringVar(&o.NodeTokens, "node-tokens", "", "local mode: file of \"<node-name> <token>\" lines; node proxies authenticate with \"authorization: Bearer <token>\" (without it every call is refused)")
	fs.StringVar(&o.RootCert, "root-cert", "", "root CA certificate PEM (with --root-key); default: load or create one in the state dir")
	fs.StringVar(&o.RootKey, "root-key", "", "root CA private key PEM")
	fs.BoolVar(&o.EnrollmentFromLabels, "enrollment-from-labels", true, "treat pods matching the ambient enrollment labels as HBONE-enrolled (default false in Kubernetes mode, where the node agent annotates them)")
	fs.StringVar(&o.WebhookAddr, "webhook-addr", "", "Kubernetes mode: address of the validating admission webhook (HTTPS, "+webhook.Path+"; the chart uses "+webhook.DefaultAddr+"); it keeps ValidatingWebhookConfiguration "+webhook.ConfigurationName+"'s caBundle set (\"\": none)")
	fs.StringVar(&o.WaypointImage, "waypoint-image", "", "Kubernetes mode: deploy a waypoint of this image (ServiceAccount, Service, Deployment, Gateway status) for every Gateway of class istio-waypoint while leading (\"\": none)")
	fs.StringVar(&o.WaypointTemplate, "waypoint-template", "", "Kubernetes mode, with --waypoint-image: render each waypoint's Deployment from this Go text/template file (the chart's ConfigMap ztunnel-go-waypoint-template), re-read on every reconcile; one that fails to render leaves the Gateway Programmed=False (\"\": the built-in Deployment)")
	fs.StringVar(&o.WaypointValues, "waypoint-values", "", "the --waypoint-template's .Values (YAML file)")
	fs.StringVar(&o.WaypointCRLFile, "waypoint-crl-file", "", "Kubernetes mode, with --waypoint-image: CRLs every waypoint enforces (copied into each waypoint namespace as ConfigMap istio-ca-crl, CRL_PATH), read on every reconcile; unreadable leaves the Gateways Programmed=False (\"\": none)")
	fs.StringVar(&o.PathNormalization, "path-normalization", "", "meshConfig pathNormalization: how waypoints normalize request paths before authorization and routing, and forward them: NONE, BASE, MERGE_SLASHES or DECODE_AND_MERGE_SLASHES (\"\": BASE, Istio's default)")
	fs.BoolVar(&o.ExternalNameAlias, "external-name-alias", true, "serve ExternalName Services that point at mesh services as DNS aliases")
	fs.BoolVar(&o.JWKSAllowHTTP, "jwks-allow-http", false, "also fetch http:// RequestAuthentication jwksUri and OpenID discovery URLs (default: https only)")
	fs.BoolVar(&o.JWKSAllowInternal, "jwks-allow-internal", false, "also fetch jwksUri / OpenID discovery from loopback, link-local and cluster-internal addresses (pods, nodes, Services, --jwks-internal-cidrs)")
	fs.StringVar(&o.JWKSInternalCIDRs, "jwks-internal-cidrs", "", "comma-separated cluster-internal ranges (Service and pod CIDRs) never fetched from without --jwks-allow-internal")
	fs.StringVar(&o.MeshConfig, "mesh-config", "", "Istio MeshConfig file (YAML): defaultServiceExportTo, defaultVirtualServiceExportTo, defaultDestinationRuleExportTo, serviceEntryVisibility, serviceScopeConfigs, pathNormalization, extensionProviders, defaultProviders and defaultConfig.tracing.sampling are honoured (\"\": every Service and ServiceEntry is exported everywhere unless its exportTo says otherwise)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Kubernetes mode: read the cluster from the API server with this kubeconfig")
	fs.BoolVar(&o.InCluster, "in-cluster", false, "Kubernetes mode with the pod's own service account (in-cluster configuration)")
	fs.StringVar(&o.TrustedNodeAccounts, "trusted-node-accounts", "istio-system/ztunnel", "Kubernetes mode: comma-separated namespace/name ServiceAccounts of node proxies (CA_TRUSTED_NODE_ACCOUNTS)")
	fs.StringVar(&o.SystemNamespace, "system-namespace", "istio-system", "Kubernetes mode: the namespace this control plane runs in: it publishes ConfigMap "+bootstrap.RootConfigMapName+" there, and its serving certificate covers "+bootstrap.ServiceName+".<namespace>.svc")
	fs.StringVar(&o.LeaseNamespace, "lease-namespace", kubestatus.DefaultLeaseNamespace, "Kubernetes mode: namespace of the leader-election Lease for ServiceEntry address and Istio object status writes")
	fs.StringVar(&o.LeaseName, "lease-name", kubestatus.DefaultLeaseName, "Kubernetes mode: name of that Lease")
	version := daemon.VersionFlag(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if *version {
		return o, daemon.ErrVersion
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	enrollSet := false
	fs.Visit(func(f *flag.Flag) { enrollSet = enrollSet || f.Name == "enrollment-from-labels" })
	if o.KubeMode() && !enrollSet {
		// The node agent writes ambient.istio.io/redirection; istiod keys
		// off it alone.
		o.EnrollmentFromLabels = false
	}
	if _, err := o.log.Config(); err != nil {
		return o, err
	}
	return o, o.Validate()
}

// summary is what --check-flags prints: the flags' effect as a deployment
// sees it.
type summary struct {
	Mode          string   `json:"mode"` // "local" or "kubernetes"
	Listen        string   `json:"listen"`
	Admin         string   `json:"admin,omitempty"` // loopback only
	MetricsAddr   string   `json:"metrics_addr,omitempty"`
	ReadinessAddr string   `json:"readiness_addr,omitempty"`
	ReadinessPath string   `json:"readiness_path,omitempty"`
	ServingNames  []string `json:"serving_names"`
	// Kubernetes mode.
	RootConfigMap       string   `json:"root_configmap,omitempty"` // namespace/name
	RootConfigMapKey    string   `json:"root_configmap_key,omitempty"`
	TrustedNodeAccounts []string `json:"trusted_node_accounts,omitempty"`
	Lease               string   `json:"lease,omitempty"` // namespace/name
	WebhookAddr         string   `json:"webhook_addr,omitempty"`
	WaypointImage       string   `json:"waypoint_image,omitempty"`
	WaypointTemplate    string   `json:"waypoint_template,omitempty"`
	WaypointCRLFile     string   `json:"waypoint_crl_file,omitempty"`
	// RemoteSecrets: where remote secrets are read ("": multicluster off).
	RemoteSecrets    string `json:"remote_secrets,omitempty"`
	RemoteStaleAfter string `json:"remote_stale_after,omitempty"`
}

func (o options) summary() summary {
	s := summary{Mode: "local", Listen: o.Listen, Admin: o.AdminAddr, MetricsAddr: o.MetricsAddr, ServingNames: o.ServingNames()}
	if s.ServingNames == nil {
		s.ServingNames = caserver.DefaultServingNames(o.RootNamespace) // plus the listener's IP, if specific
	}
	if o.ReadinessAddr != "" {
		s.ReadinessAddr, s.ReadinessPath = o.ReadinessAddr, daemon.ReadyPath
	}
	if o.KubeMode() {
		s.Mode = "kubernetes"
		s.RootConfigMap, s.RootConfigMapKey = o.SystemNamespace+"/"+bootstrap.RootConfigMapName, bootstrap.RootConfigMapKey
		s.TrustedNodeAccounts, _ = kubeauth.ParseAccounts(o.TrustedNodeAccounts)
		s.Lease = o.LeaseNamespace + "/" + o.LeaseName
		s.WebhookAddr = o.WebhookAddr
		s.WaypointImage = o.WaypointImage
		s.WaypointTemplate = o.WaypointTemplate
		s.WaypointCRLFile = o.WaypointCRLFile
		if o.Multicluster {
			s.RemoteSecrets = o.SystemNamespace + "/" + multicluster.SecretLabel + "=true"
			s.RemoteStaleAfter = o.RemoteStaleAfter.String()
		}
	}
	return s
}
