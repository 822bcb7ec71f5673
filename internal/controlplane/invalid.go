package controlplane

import (
	"errors"
	"strings"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// originSource is a cluster.Source that knows where each object was read
// from (local mode's directory: cluster/local.Source.Origin).
type originSource interface {
	Origin(key string) (file string, doc int, ok bool)
}

// invalidLines lists every policy value that cannot be enforced (and so
// fails closed; translate.PolicyStatus.Invalid), and every ServiceEntry
// address refused as owned by another, one line each. When the
// source knows the object's file, the line has the form of a decode error
// (cluster.DocError: file, document, kind and name, then the field).
func (c *ControlPlane) invalidLines(res *translate.Result) []string {
	var out []string
	locate, _ := c.cfg.Source.(originSource)
	for _, st := range res.Policies {
		for _, inv := range st.Invalid {
			msg := inv + " (fails closed: see the object's status)"
			ns, name, _ := strings.Cut(st.Name, "/")
			if locate != nil {
				if f, i, ok := locate.Origin(st.Kind + "/" + ns + "/" + name); ok {
					out = append(out, (&cluster.DocError{File: f, Index: i, Kind: st.Kind, Name: st.Name, Err: errors.New(msg)}).Error())
					continue
				}
			}
			out = append(out, st.Kind+" "+st.Name+": "+msg)
		}
	}
	return out
}

// reportInvalid logs each invalid value at warning the first time a
// translation reports it. Apply's goroutine only.
func (c *ControlPlane) reportInvalid(res *translate.Result) {
	lines := c.invalidLines(res)
	current := make(map[string]bool, len(lines))
	for _, l := range lines {
		current[l] = true
		if !c.invalidSeen[l] {
			c.log.Warn("policy value cannot be enforced; the policy fails closed", zap.String("problem", l))
		}
	}
	c.invalidSeen = current
}
