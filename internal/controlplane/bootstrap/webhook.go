package bootstrap

import (
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/webhook"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// webhookServer is Kubernetes mode's validating admission webhook: HTTPS
// with a certificate for the Service's names (the API server calls
// ztunnel-cp.<namespace>.svc), signed by the root it writes into the
// chart's webhook configuration.
func webhookServer(o Options, authority *ca.CA, kc kubernetes.Interface, log *zap.Logger, retries *backoff.Set) (*webhook.Server, error) {
	cert, err := caserver.ServingCertificate(authority, o.ServingNames(), 365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	return webhook.NewServer(webhook.ServerConfig{
		Addr: o.WebhookAddr, Cert: cert, CABundle: authority.RootPEM(), Client: kc,
		Validation: webhook.Config{RootNamespace: o.RootNamespace}, Log: log.Named("webhook"), Retries: retries,
	})
}
