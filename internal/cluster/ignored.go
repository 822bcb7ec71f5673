package cluster

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// IgnoredObject is an object of an Istio or Gateway API kind that the
// control plane does not read (a VirtualService, say): only its identity is
// kept, so that the control plane can tell the user it has no effect.
type IgnoredObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
}

// GetNamespace returns the object's namespace.
func (o *IgnoredObject) GetNamespace() string { return o.Namespace }

// GetName returns the object's name.
func (o *IgnoredObject) GetName() string { return o.Name }

// ignoredKinds are the group/kind pairs Decode records in Objects.Ignored
// instead of reporting ErrUnsupportedKind: mesh configuration a user may
// expect to work, whose absence of effect must be reported, not skipped.
var ignoredKinds = map[string]bool{
	"networking.istio.io/Sidecar":        true,
	"networking.istio.io/EnvoyFilter":    true,
	"networking.istio.io/Gateway":        true,
	"networking.istio.io/WorkloadGroup":  true,
	"networking.istio.io/ProxyConfig":    true,
	"extensions.istio.io/WasmPlugin":     true,
	"gateway.networking.k8s.io/TCPRoute": true,
	"gateway.networking.k8s.io/TLSRoute": true,
}

// IgnoredKinds returns the group/kind pairs of ignoredKinds, sorted: the
// kinds a Kubernetes source watches (metadata only) to report them.
func IgnoredKinds() []schema.GroupKind {
	out := make([]schema.GroupKind, 0, len(ignoredKinds))
	for gk := range ignoredKinds {
		g, k, _ := strings.Cut(gk, "/")
		out = append(out, schema.GroupKind{Group: g, Kind: k})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// ignoredKind reports whether group/kind is one of ignoredKinds.
func ignoredKind(group, kind string) bool { return ignoredKinds[group+"/"+kind] }

func (o *Objects) ignoredItems() []Item {
	out := make([]Item, 0, len(o.Ignored))
	for _, v := range o.Ignored {
		out = append(out, Item{Key: fmt.Sprintf("%s/%s/%s", v.Kind, v.Namespace, v.Name), Obj: v})
	}
	return out
}

func (o *Objects) sortIgnored() {
	sort.Slice(o.Ignored, func(i, j int) bool {
		a, b := o.Ignored[i], o.Ignored[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
}
