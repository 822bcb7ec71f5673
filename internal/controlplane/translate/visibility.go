package translate

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// AnnotationExportTo is Istio's exportTo for a Kubernetes Service
// (comma-separated, the values of ServiceEntry.exportTo).
const AnnotationExportTo = "networking.istio.io/exportTo"

// ExportToExtension names the Service extension that lists the namespaces,
// besides its own, that may see a NAMESPACE-visible service: a
// google.protobuf.StringValue, comma-separated. Istio's workload API
// carries only PUBLIC and NAMESPACE, and one node proxy serves pods of many
// namespaces, so the control plane cannot filter per client; the node
// proxy filters per connection and per DNS query instead. A node proxy
// that does not know the extension sees plain NAMESPACE: narrower, never
// wider.
const ExportToExtension = "ztunnel-go.io/export-to"

// exportSet is who may see an object, as Istio's exportTo says: every
// namespace (all), or the namespaces listed (none when empty).
type exportSet struct {
	all bool
	ns  []string // sorted, without duplicates
}

func (e exportSet) none() bool { return !e.all && len(e.ns) == 0 }

// parseExportTo reads exportTo values for an object of namespace own:
// "*" is every namespace, "." own, "~" none, else a namespace name. nil
// or empty means def (the mesh default, itself defaulting to "*"). An
// invalid list ("*" or "~" mixed with others, a value that is no
// namespace name) narrows to own and is reported in bad (fail closed).
func parseExportTo(vals, def []string, own, field string) (exportSet, []string) {
	if len(vals) == 0 {
		vals, field = def, "meshConfig default"
		if len(vals) == 0 {
			return exportSet{all: true}, nil
		}
	}
	var e exportSet
	var bad []string
	for i, v := range vals {
		v = strings.TrimSpace(v)
		switch {
		case v == "*" || v == "~":
			if len(vals) > 1 {
				bad = append(bad, fmt.Sprintf("%s[%d]: %q cannot be combined with other values; exported to its own namespace only", field, i, v))
				return exportSet{ns: []string{own}}, bad
			}
			return exportSet{all: v == "*"}, nil
		case v == ".":
			e.ns = append(e.ns, own)
		case len(validation.IsDNS1123Label(v)) == 0:
			e.ns = append(e.ns, v)
		default:
			bad = append(bad, fmt.Sprintf("%s[%d]: %q is not a namespace name, \".\", \"*\" or \"~\"; exported to its own namespace only", field, i, v))
			return exportSet{ns: []string{own}}, bad
		}
	}
	sort.Strings(e.ns)
	e.ns = slices.Compact(e.ns)
	return e, nil
}

// visibleTo reports whether namespace ns sees an object exported as e.
func (e exportSet) visibleTo(ns string) bool { return e.all || slices.Contains(e.ns, ns) }

// narrowTo keeps only what both allow.
func (e exportSet) narrowTo(o exportSet) exportSet {
	switch {
	case o.all:
		return e
	case e.all:
		return o
	}
	var out exportSet
	for _, n := range e.ns {
		if slices.Contains(o.ns, n) {
			out.ns = append(out.ns, n)
		}
	}
	return out
}

// apply puts e on a wire Service of namespace svc.Namespace: PUBLIC for
// every namespace, else NAMESPACE plus the extension for namespaces other
// than its own. A set that leaves out its own namespace still shows it
// there (the workload API cannot say less than NAMESPACE); Istio's
// exportTo never hides an object from its own namespace's proxies either
// when it names others.
func (e exportSet) apply(svc *workloadapi.Service) {
	if e.all {
		return
	}
	svc.Visibility = workloadapi.Service_NAMESPACE
	var others []string
	for _, n := range e.ns {
		if n != svc.Namespace {
			others = append(others, n)
		}
	}
	if len(others) == 0 {
		return
	}
	cfg, err := anypb.New(wrapperspb.String(strings.Join(others, ",")))
	if err != nil {
		return // cannot happen for a StringValue; NAMESPACE alone is narrower
	}
	svc.Extensions = append(svc.Extensions, &workloadapi.Extension{Name: ExportToExtension, Config: cfg})
}

// serviceExport is a Kubernetes Service's visibility: its exportTo
// annotation, else meshConfig.defaultServiceExportTo.
func (t *translator) serviceExport(s *corev1.Service) (exportSet, []string) {
	var vals []string
	if a, ok := s.Annotations[AnnotationExportTo]; ok {
		vals = strings.Split(a, ",")
	}
	return parseExportTo(vals, t.cfg.DefaultServiceExportTo, s.Namespace, "metadata.annotations["+AnnotationExportTo+"]")
}

// serviceEntryExport is a ServiceEntry's visibility: spec.exportTo (else
// meshConfig.defaultServiceExportTo), narrowed by
// meshConfig.serviceEntryVisibility (Istio 1.31: the first policy whose
// namespace selectors all match the entry's namespace labels, else the
// default; NONE is nobody, NAMESPACE its own namespace, PUBLIC no further
// limit). Upstream's ambient index reads only serviceEntryVisibility; we
// honour both, and the narrower wins.
func (t *translator) serviceEntryExport(se *networkingv1.ServiceEntry) (exportSet, []string) {
	e, bad := parseExportTo(se.Spec.ExportTo, t.cfg.DefaultServiceExportTo, se.Namespace, "spec.exportTo")
	var nsLabels map[string]string
	if ns := t.idx.namespaces[se.Namespace]; ns != nil {
		nsLabels = ns.Labels
	}
	switch seVisibility(t.cfg.ServiceEntryVisibility, nsLabels) {
	case meshv1alpha1.ServiceEntryVisibility_NONE:
		e = exportSet{}
	case meshv1alpha1.ServiceEntryVisibility_NAMESPACE:
		e = e.narrowTo(exportSet{ns: []string{se.Namespace}})
	}
	return e, bad
}

// seVisibility evaluates meshConfig.serviceEntryVisibility for a namespace
// with labels nsLabels. A nil config is PUBLIC.
// A rule whose selector does not parse, or of a kind this control plane
// does not know, never matches (as upstream's); a policy with such a rule
// thus never applies.
func seVisibility(sev *meshv1alpha1.ServiceEntryVisibility, nsLabels map[string]string) meshv1alpha1.ServiceEntryVisibility_Visibility {
	if sev == nil {
		return meshv1alpha1.ServiceEntryVisibility_PUBLIC
	}
	set := labels.Set(nsLabels)
	for _, p := range sev.GetPolicies() {
		match := true
		for _, r := range p.GetMatchingRules() {
			ls := r.GetNamespaceSelector()
			if ls == nil {
				match = false
				break
			}
			sel, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchLabels: ls.GetMatchLabels(), MatchExpressions: labelExprs(ls)})
			if err != nil || !sel.Matches(set) {
				match = false
				break
			}
		}
		if match {
			return publicIfUnset(p.GetVisibility())
		}
	}
	return publicIfUnset(sev.GetDefaultVisibility())
}

func publicIfUnset(v meshv1alpha1.ServiceEntryVisibility_Visibility) meshv1alpha1.ServiceEntryVisibility_Visibility {
	if v == meshv1alpha1.ServiceEntryVisibility_VISIBILITY_UNSPECIFIED {
		return meshv1alpha1.ServiceEntryVisibility_PUBLIC
	}
	return v
}

func labelExprs(ls *meshv1alpha1.LabelSelector) []metav1.LabelSelectorRequirement {
	var out []metav1.LabelSelectorRequirement
	for _, r := range ls.GetMatchExpressions() {
		out = append(out, metav1.LabelSelectorRequirement{Key: r.GetKey(), Operator: metav1.LabelSelectorOperator(r.GetOperator()), Values: r.GetValues()})
	}
	return out
}

// meets reports whether some namespace sees both e (of namespace a) and
// o (of namespace b): each is always seen by its own namespace.
func (e exportSet) meets(a string, o exportSet, b string) bool {
	if e.all || o.all {
		return true
	}
	in := func(s exportSet, own, n string) bool { return n == own || slices.Contains(s.ns, n) }
	return in(o, b, a) || in(e, a, b) || slices.ContainsFunc(e.ns, func(n string) bool { return in(o, b, n) })
}
