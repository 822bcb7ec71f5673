package translate

import (
	"fmt"
	"reflect"
	"strings"

	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// RouteControllerName is the controllerName of the status.parents entries
// the control plane writes into HTTPRoutes and GRPCRoutes. It is ours, not
// istiod's (istio.io/gateway-controller): both may run side by side, and
// each owns only its own entries.
const RouteControllerName = "ztunnel-go.io/mesh-controller"

// RouteStatus is what the control plane reports of one HTTPRoute or
// GRPCRoute: one entry per parentRef the mesh serves (kind Service, or
// ServiceEntry of networking.istio.io); parentRefs to Gateways belong to
// their Gateway's controller and get no entry here.
type RouteStatus struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Generation the conditions were computed from (observedGeneration).
	Generation int64               `json:"generation"`
	Parents    []RouteParentStatus `json:"parents"`
}

// RouteParentStatus is one status.parents entry.
type RouteParentStatus struct {
	ParentRef    gatewayv1.ParentReference `json:"parentRef"`
	Accepted     RouteCondition            `json:"accepted"`
	ResolvedRefs RouteCondition            `json:"resolvedRefs"`
}

// RouteCondition is one condition of a RouteParentStatus.
type RouteCondition struct {
	Status  bool                           `json:"status"`
	Reason  gatewayv1.RouteConditionReason `json:"reason"`
	Message string                         `json:"message"`
}

// RouteStatuses computes the status of every HTTPRoute and GRPCRoute with
// a mesh parentRef, sorted by kind, namespace and name, from the same
// resolution the waypoint configs use (routesFor, backend):
//   - Accepted: False with NoMatchingParent when the parent Service or
//     ServiceEntry does not exist or has no port matching parentRef port or
//     sectionName; False with UnsupportedValue when a rule uses a filter
//     the waypoint does not implement (that rule answers 500, the others
//     route); else True, saying whether it is a producer route (every
//     client) or a consumer route (clients in the route's namespace only).
//   - ResolvedRefs: False with RefNotPermitted (another namespace, no
//     ReferenceGrant), InvalidKind or BackendNotFound for the first refused
//     backendRef or RequestMirror backend, naming each; else True.
//
// Pure: the status writer (kubestatus.RouteWriter) and zctl share it.
func RouteStatuses(cfg Config, objs *cluster.Objects) []RouteStatus {
	if objs == nil {
		return nil
	}
	t := newTranslator(cfg.withDefaults(), objs, nil)
	t.buildIndexOf(false)
	var out []RouteStatus
	for _, r := range objs.HTTPRoutes {
		var unsupported []string
		var refs []*backendRefProblem
		for i, rule := range r.Spec.Rules {
			for _, b := range rule.BackendRefs {
				if _, bad := t.backend(kindHTTPRoute, r.Namespace, r.Spec.ParentRefs, b.BackendRef); bad != nil {
					refs = append(refs, bad)
				}
			}
			for _, f := range rule.Filters {
				if f.Type == gatewayv1.HTTPRouteFilterRequestMirror && f.RequestMirror != nil {
					if _, bad := t.mirror(r.Namespace, f.RequestMirror); bad != nil {
						refs = append(refs, bad)
					}
				}
			}
			unsupported = append(unsupported, unsupportedHTTPRule(i, rule)...)
		}
		if st, ok := t.routeStatus(kindHTTPRoute, r.Namespace, r.Name, r.Generation, r.Spec.ParentRefs, unsupported, refs); ok {
			out = append(out, st)
		}
	}
	for _, r := range objs.GRPCRoutes {
		var unsupported []string
		var refs []*backendRefProblem
		for i, rule := range r.Spec.Rules {
			for _, b := range rule.BackendRefs {
				if _, bad := t.backend(kindGRPCRoute, r.Namespace, r.Spec.ParentRefs, b.BackendRef); bad != nil {
					refs = append(refs, bad)
				}
			}
			unsupported = append(unsupported, unsupportedGRPCRule(i, rule)...)
		}
		if st, ok := t.routeStatus(kindGRPCRoute, r.Namespace, r.Name, r.Generation, r.Spec.ParentRefs, unsupported, refs); ok {
			out = append(out, st)
		}
	}
	return out
}

func (t *translator) routeStatus(kind, ns, name string, gen int64, parents []gatewayv1.ParentReference, unsupported []string, refs []*backendRefProblem) (RouteStatus, bool) {
	st := RouteStatus{Kind: kind, Namespace: ns, Name: name, Generation: gen}
	resolved := RouteCondition{Status: true, Reason: gatewayv1.RouteReasonResolvedRefs, Message: "every backendRef resolved"}
	if len(refs) > 0 {
		var msgs []string
		for _, p := range refs {
			msgs = append(msgs, p.message)
		}
		resolved = RouteCondition{Reason: refs[0].reason,
			Message: strings.Join(msgs, "; ") + "; requests routed to a refused backend are answered 500"}
	}
	for _, pr := range parents {
		pk := parentKind(pr)
		if pk == "" || containsParentRef(st.Parents, pr) {
			continue
		}
		pns := parentNamespace(ns, pr)
		acc := RouteCondition{Status: true, Reason: gatewayv1.RouteReasonAccepted}
		_, portOK := t.parentPorts(pk, pns, string(pr.Name), pr)
		exists := pk == "Service" && t.service(pns, string(pr.Name)) != nil || pk == "ServiceEntry" && t.serviceEntry(pns, string(pr.Name)) != nil
		switch {
		case !exists:
			acc = RouteCondition{Reason: gatewayv1.RouteReasonNoMatchingParent, Message: fmt.Sprintf("%s %s/%s does not exist", pk, pns, pr.Name)}
		case !portOK:
			acc = RouteCondition{Reason: gatewayv1.RouteReasonNoMatchingParent, Message: fmt.Sprintf("%s %s/%s has no port matching parentRef %s", pk, pns, pr.Name, describePort(pr))}
		case len(unsupported) > 0:
			acc = RouteCondition{Reason: gatewayv1.RouteReasonUnsupportedValue, Message: strings.Join(unsupported, "; ") +
				" not supported by ztunnel-go's waypoint: requests matching those rules are answered 500 (a filter is never skipped); the other rules route"}
		case pns == ns:
			acc.Message = fmt.Sprintf("producer route: applies to every client of %s %s/%s", pk, pns, pr.Name)
		default:
			acc.Message = fmt.Sprintf("consumer route: applies only to clients in namespace %s (by their mesh identity) calling %s %s/%s", ns, pk, pns, pr.Name)
		}
		if acc.Status && (pr.Port != nil || pr.SectionName != nil) {
			acc.Message += ", scoped to parentRef " + describePort(pr)
		}
		st.Parents = append(st.Parents, RouteParentStatus{ParentRef: pr, Accepted: acc, ResolvedRefs: resolved})
	}
	return st, len(st.Parents) > 0
}

func describePort(pr gatewayv1.ParentReference) string {
	var parts []string
	if pr.Port != nil {
		parts = append(parts, fmt.Sprintf("port %d", *pr.Port))
	}
	if pr.SectionName != nil {
		parts = append(parts, fmt.Sprintf("sectionName %q", *pr.SectionName))
	}
	return strings.Join(parts, " ")
}

// containsParentRef: parentRefs are compared whole (a repeated parentRef
// gets one entry).
func containsParentRef(ps []RouteParentStatus, pr gatewayv1.ParentReference) bool {
	for _, p := range ps {
		if reflect.DeepEqual(p.ParentRef, pr) {
			return true
		}
	}
	return false
}
