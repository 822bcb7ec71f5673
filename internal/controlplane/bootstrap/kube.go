package bootstrap

import (
	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubeauth"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubestatus"
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
	root      *RootPublisher
	kube      kubernetes.Interface
}

func kubeWiring(o Options, log *zap.Logger) (*kubeParts, error) {
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
		LeaseNamespace: o.LeaseNamespace, LeaseName: o.LeaseName, Log: log.Named("se-status"),
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
		root:      &RootPublisher{Client: clients.Kube, Namespace: o.SystemNamespace, Log: log.Named("root-configmap")},
	}, nil
}
