package plugin

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
)

// ErrPodNotFound is returned (wrapped) by PodSource.Lookup for a pod the
// source does not know (yet).
var ErrPodNotFound = errors.New("pod not found")

// PodSource looks up the metadata the enrollment rule needs.
type PodSource interface {
	// Lookup returns the pod namespace/name and its Namespace object. The
	// Namespace is nil when the source does not have it. For an absent pod
	// it returns ErrPodNotFound (wrapped) together with the Namespace, if
	// known, so the caller can fail closed in ambient namespaces.
	Lookup(ctx context.Context, namespace, name string) (*corev1.Pod, *corev1.Namespace, error)
}

// LocalDirSource reads local mode's YAML directory (the same directory the
// control plane reads) afresh on every Lookup: the plugin is a short-lived
// process, and a retry must see a pod written meanwhile.
type LocalDirSource struct {
	Dir string
}

// Lookup implements PodSource.
func (s LocalDirSource) Lookup(_ context.Context, namespace, name string) (*corev1.Pod, *corev1.Namespace, error) {
	src := local.New(s.Dir, nil, 0) // bad documents are skipped; the agent reports them
	if _, err := src.Load(); err != nil {
		return nil, nil, fmt.Errorf("plugin: pod metadata: %w", err)
	}
	objs, _ := src.Current()
	ns := objs.Namespace(namespace)
	for _, p := range objs.Pods {
		if p.Namespace == namespace && p.Name == name {
			return p, ns, nil
		}
	}
	return nil, ns, fmt.Errorf("plugin: %s/%s in %s: %w", namespace, name, s.Dir, ErrPodNotFound)
}
