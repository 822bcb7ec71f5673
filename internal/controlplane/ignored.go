package controlplane

import (
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// ignoredLine is how an object of a kind the control plane does not read is
// reported (log and ConfigDump.Ignored).
func ignoredLine(o *cluster.IgnoredObject) string {
	return o.Kind + " " + o.Namespace + "/" + o.Name + " (" + o.APIVersion + "): ztunnel-go does not read this kind; it has no effect"
}

// reportIgnored logs each ignored object once, at warning, the first time
// a set holds it (again if it is removed and comes back). Apply's goroutine
// only.
func (c *ControlPlane) reportIgnored(objs []*cluster.IgnoredObject) {
	current := make(map[string]bool, len(objs))
	for _, o := range objs {
		key := o.Kind + "/" + o.Namespace + "/" + o.Name
		current[key] = true
		if !c.ignoredSeen[key] {
			c.log.Warn("ignored object: this kind is not read by the control plane",
				zap.String("kind", o.Kind), zap.String("apiVersion", o.APIVersion),
				zap.String("namespace", o.Namespace), zap.String("name", o.Name))
		}
	}
	c.ignoredSeen = current
}

func ignoredLines(objs []*cluster.IgnoredObject) []string {
	var out []string
	for _, o := range objs {
		out = append(out, ignoredLine(o))
	}
	return out
}
