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
	// tasks run beside the agent, as daemon.Group tasks by these names.
	tasks []bootTask
	owner *agentkube.OwnerWatch // nil without Options.DaemonSetName
}

// bootTask is a task of the agent's daemon.Group.
type bootTask struct {
	name string
	run  func(context.Context) error
}

// forever adapts a run function that returns nothing.
func forever(run func(context.Context)) func(context.Context) error {
	return func(ctx context.Context) error { run(ctx); return nil }
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
	k := &kubeParts{src: src, status: sw, pluginKubeconfig: o.Kubeconfig, tasks: []bootTask{{"status writer", forever(sw.Run)}}}
	if o.DaemonSetName != "" {
		ns := o.DaemonSetNamespace
		if ns == "" {
			ns = o.SystemNamespace
		}
		if k.owner, err = agentkube.NewOwnerWatch(clients.Kube, ns, o.DaemonSetName, log.Named("owner")); err != nil {
			return nil, err
		}
		k.tasks = append(k.tasks, bootTask{"owner watch", forever(k.owner.Run)})
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
		k.tasks = append(k.tasks, bootTask{"plugin kubeconfig refresh", func(ctx context.Context) error {
			t := time.NewTicker(kubeconfigRefresh)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
				if _, err := agentkube.WriteKubeconfig(path, rc); err != nil {
					log.Warn("refreshing the plugin kubeconfig failed", zap.Error(err))
				}
			}
		}})
	}
	return k, nil
}
