package bootstrap

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	agentkube "github.com/ztunnel-go/ztunnel-go/cni/agent/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
)

// kubeconfigRefresh spaces rewrites of the plugin's kubeconfig (the
// projected token rotates).
const kubeconfigRefresh = time.Minute

// kubeParts are Kubernetes mode's agent source, status writer, the plugin's
// kubeconfig and the goroutines they need.
type kubeParts struct {
	src              cluster.Source
	status           agent.StatusWriter
	pluginKubeconfig string
	background       []func(context.Context)
	owner            *agentkube.OwnerWatch // nil without Options.DaemonSetName
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
	src, err := agentkube.NewSource(clients.Kube, o.NodeName, log.Named("source"))
	if err != nil {
		return nil, err
	}
	sw, err := agentkube.NewStatusWriter(agentkube.StatusConfig{Client: clients.Kube, Source: src, Log: log.Named("status")})
	if err != nil {
		return nil, err
	}
	k := &kubeParts{src: src, status: sw, pluginKubeconfig: o.Kubeconfig, background: []func(context.Context){sw.Run}}
	if o.DaemonSetName != "" {
		ns := o.DaemonSetNamespace
		if ns == "" {
			ns = o.SystemNamespace
		}
		if k.owner, err = agentkube.NewOwnerWatch(clients.Kube, ns, o.DaemonSetName, log.Named("owner")); err != nil {
			return nil, err
		}
		k.background = append(k.background, k.owner.Run)
	}
	if o.Kubeconfig == "" {
		// In a pod: the plugin runs on the host and cannot read our
		// service account; give it a kubeconfig, rewritten when the
		// projected token rotates.
		path := o.PluginKubeconfigPath()
		if _, err := agentkube.WriteKubeconfig(path, rc); err != nil {
			return nil, err
		}
		k.pluginKubeconfig = path
		k.background = append(k.background, func(ctx context.Context) {
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(kubeconfigRefresh):
				}
				if _, err := agentkube.WriteKubeconfig(path, rc); err != nil {
					log.Warn("refreshing the plugin kubeconfig failed", zap.Error(err))
				}
			}
		})
	}
	return k, nil
}
