package realnode

import (
	"context"
	"fmt"
	"strings"
)

// TagImage gives the image src, already imported into containerd's CRI
// namespace, the extra reference dst (ctr images tag --force: an existing
// dst is moved). No registry is reachable from the node, so this is how a
// test makes a "new version" of a component: a pod template naming dst
// differs from one naming src, and a rollout to it replaces the pods, while
// the kubelet (imagePullPolicy Never/IfNotPresent) finds dst locally. The
// CRI plugin picks the new reference up from containerd's image events.
func (n *Node) TagImage(ctx context.Context, src, dst string) error {
	if src == "" || dst == "" || src == dst {
		return fmt.Errorf("realnode: tag image %q as %q: want two different references", src, dst)
	}
	if _, err := Ctr(ctx, "images", "tag", "--force", src, dst); err != nil {
		return fmt.Errorf("realnode: tag image: %w", err)
	}
	if ok, err := n.HasImage(ctx, dst); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("realnode: tag image %s as %s: containerd does not list %s afterwards", src, dst, dst)
	}
	return nil
}

// HasImage reports whether containerd's CRI namespace holds ref.
func (n *Node) HasImage(ctx context.Context, ref string) (bool, error) {
	out, err := Ctr(ctx, "images", "ls", "-q")
	if err != nil {
		return false, fmt.Errorf("realnode: list images: %w", err)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == ref {
			return true, nil
		}
	}
	return false, nil
}
