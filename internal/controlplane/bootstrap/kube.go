package bootstrap

import (
	"fmt"
	"net"
	"os"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubeauth"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubestatus"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/waypointctl"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// kubeParts are Kubernetes mode's source, authenticator, live placement,
// allocator, ServiceEntry status writer and root ConfigMap publisher
// (RootPEM still to be set).
type kubeParts struct {
	src       *kube.Source
	auth      *kubeauth.Authenticator
	placement *kubeauth.Placement
	alloc     *autoalloc.Allocator
	status    *kubestatus.Writer
	istio     *kubestatus.IstioWriter
	routes    *kubestatus.RouteWriter
	root      *RootPublisher
	kube      kubernetes.Interface
	gateway   gatewayclient.Interface
}

func kubeWiring(o Options, log *zap.Logger, retries *backoff.Set) (*kubeParts, error) {
	rc, err := kube.RESTConfig(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	clients, err := kube.NewClients(rc)
	if err != nil {
		return nil, err
	}
	src, err := kube.New(kube.Config{Clients: clients, WatchIgnored: true, Log: log.Named("source")})
	if err != nil {
		return nil, err
	}
	trusted, err := kubeauth.ParseAccounts(o.TrustedNodeAccounts)
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
		LeaseNamespace: o.LeaseNamespace, LeaseName: o.LeaseName, Log: log.Named("se-status"), Retries: retries,
	})
	if err != nil {
		return nil, err
	}
	istioStatus, err := kubestatus.NewIstio(kubestatus.IstioConfig{
		Istio: clients.Istio, Leading: status.Leading, Log: log.Named("istio-status"), Retries: retries,
	})
	if err != nil {
		return nil, err
	}
	alloc, err := autoalloc.New(autoalloc.Config{Store: status})
	if err != nil {
		return nil, err
	}
	routes, err := kubestatus.NewRouteWriter(kubestatus.RouteConfig{
		Gateway: clients.Gateway, Source: src, Translate: translateConfig(o), Leading: status.Leading, Log: log.Named("route-status"),
	})
	if err != nil {
		return nil, err
	}
	return &kubeParts{
		src: src, auth: auth, alloc: alloc, status: status, istio: istioStatus, routes: routes, kube: clients.Kube, gateway: clients.Gateway,
		placement: &kubeauth.Placement{Client: clients.Kube, Log: log.Named("placement")},
		root:      &RootPublisher{Client: clients.Kube, Namespace: o.SystemNamespace, Log: log.Named("root-configmap")},
	}, nil
}

// waypointController deploys waypoints for Gateways of class istio-waypoint
// while this replica leads (the ServiceEntry status lease); they reach the
// control plane through its Service.
func waypointController(o Options, k *kubeParts, rootPEM []byte, log *zap.Logger) (*waypointctl.Controller, error) {
	_, port, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return nil, fmt.Errorf("--listen: %w", err)
	}
	cfg := waypointctl.Config{
		Kube: k.kube, Gateway: k.gateway, Source: k.src, Leading: k.status.Leading,
		Image: o.WaypointImage, XDSAddress: net.JoinHostPort(ServiceName+"."+o.SystemNamespace+".svc", port),
		TrustDomain: o.TrustDomain, RootPEM: func() []byte { return rootPEM }, Log: log.Named("waypoints"),
		TemplateFile: o.WaypointTemplate, ValuesFile: o.WaypointValues, RootNamespace: o.RootNamespace,
	}
	if f := o.WaypointCRLFile; f != "" {
		cfg.CRLPEM = func() ([]byte, error) { return os.ReadFile(f) }
	}
	return waypointctl.New(cfg)
}
