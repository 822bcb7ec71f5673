package kube

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// OwnerWatch follows the agent's own DaemonSet, so that on shutdown the
// agent can tell an uninstall (the DaemonSet is gone or being deleted:
// remove the plugin from the CNI chain, or every new pod on the node would
// fail) from an upgrade or restart (it exists: keep the plugin, so new
// ambient pods wait for the next agent instead of starting uncaptured).
// It watches while the agent runs because an uninstall may revoke the
// agent's token before the agent gets to ask. Needs get and watch on
// daemonsets in its namespace.
type OwnerWatch struct {
	client          kubernetes.Interface
	namespace, name string
	log             *zap.Logger
	removed         atomic.Bool
}

// NewOwnerWatch returns a watch of DaemonSet namespace/name; call Run.
func NewOwnerWatch(client kubernetes.Interface, namespace, name string, log *zap.Logger) (*OwnerWatch, error) {
	if client == nil || namespace == "" || name == "" {
		return nil, errors.New("kube: owner watch needs a client and the DaemonSet's namespace and name")
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &OwnerWatch{client: client, namespace: namespace, name: name, log: log}, nil
}

// Run watches the DaemonSet until ctx is done, re-establishing the watch
// after errors.
func (w *OwnerWatch) Run(ctx context.Context) {
	sel := fields.OneTermEqualSelector("metadata.name", w.name).String()
	for ctx.Err() == nil {
		wi, err := w.client.AppsV1().DaemonSets(w.namespace).Watch(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			w.log.Debug("watching the agent's DaemonSet failed; retrying", zap.Error(err))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for ev := range wi.ResultChan() {
			if ev.Type == watch.Deleted || w.deleting(ev.Object) {
				if !w.removed.Swap(true) {
					w.log.Info("the agent's DaemonSet is being deleted: the CNI plugin will be uninstalled on exit",
						zap.String("daemonset", w.namespace+"/"+w.name))
				}
			}
		}
		wi.Stop()
	}
}

func (w *OwnerWatch) deleting(obj any) bool {
	m, ok := obj.(metav1.Object)
	return ok && m.GetDeletionTimestamp() != nil
}

// Uninstalling decides, at shutdown, whether this is an uninstall, and why.
// A deletion seen by Run, or the DaemonSet absent or being deleted now, is;
// if the API server cannot say (unreachable, token revoked) and no deletion
// was seen, it is not: the plugin stays (fail closed for ambient pods).
func (w *OwnerWatch) Uninstalling(ctx context.Context) (bool, string) {
	ref := w.namespace + "/" + w.name
	if w.removed.Load() {
		return true, "DaemonSet " + ref + " was deleted"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ds, err := w.client.AppsV1().DaemonSets(w.namespace).Get(ctx, w.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, "DaemonSet " + ref + " does not exist"
	case err != nil:
		return false, fmt.Sprintf("cannot tell whether DaemonSet %s exists (%v): keeping the plugin", ref, err)
	case ds.DeletionTimestamp != nil:
		return true, "DaemonSet " + ref + " is being deleted"
	}
	return false, "DaemonSet " + ref + " exists (upgrade or restart)"
}
