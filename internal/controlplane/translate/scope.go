package translate

import (
	"fmt"
	"slices"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
)

// GlobalScopeExtension names the Service extension that marks a service of
// global scope: other clusters of a multicluster mesh may reach it, and
// their endpoints of the same namespace/name join it (Merger). It carries
// no config. The node proxy's constant is state.GlobalScopeExtension.
const GlobalScopeExtension = "ztunnel-go.io/service-scope-global"

// LabelGlobal is Istio's label that gives a Service, or every Service of a
// Namespace, global scope ("true"). A Service's own label wins over its
// namespace's.
const LabelGlobal = "istio.io/global"

// serviceGlobal reports whether s has global scope: its label istio.io/global
// (else its namespace's) is "true", or a GLOBAL entry of
// meshConfig.serviceScopeConfigs matches its namespace's and its own labels
// (istiod's matchServiceScope: an empty selector matches everything, and
// LOCAL entries change nothing, local being the default).
func (t *translator) serviceGlobal(s *corev1.Service) bool {
	nsLabels := t.nsLabels(s.Namespace)
	if v, ok := s.Labels[LabelGlobal]; ok {
		if v == "true" {
			return true
		}
	} else if nsLabels[LabelGlobal] == "true" {
		return true
	}
	for _, sc := range t.cfg.ServiceScopeConfigs {
		if sc.GetScope() != meshv1alpha1.MeshConfig_ServiceScopeConfigs_GLOBAL {
			continue
		}
		if t.idx.namespaces[s.Namespace] == nil {
			continue // istiod skips a service whose namespace it does not know
		}
		if meshSelectorMatches(sc.GetNamespaceSelector(), nsLabels) && meshSelectorMatches(sc.GetServicesSelector(), s.Labels) {
			return true
		}
	}
	return false
}

// meshSelectorMatches evaluates a meshConfig LabelSelector (Kubernetes'
// semantics); nil or empty matches everything. An operator that
// ValidateServiceScopeConfigs refuses matches nothing.
func meshSelectorMatches(sel *meshv1alpha1.LabelSelector, labels map[string]string) bool {
	for k, v := range sel.GetMatchLabels() {
		if lv, ok := labels[k]; !ok || lv != v {
			return false
		}
	}
	for _, r := range sel.GetMatchExpressions() {
		v, has := labels[r.GetKey()]
		switch r.GetOperator() {
		case "In":
			if !has || !slices.Contains(r.GetValues(), v) {
				return false
			}
		case "NotIn":
			if has && slices.Contains(r.GetValues(), v) {
				return false
			}
		case "Exists":
			if !has {
				return false
			}
		case "DoesNotExist":
			if has {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// ValidateServiceScopeConfigs checks meshConfig.serviceScopeConfigs the way
// Kubernetes validates a label selector: a bad entry is an error naming its
// field path (a mesh config that half applies would scope services in a
// way nobody wrote).
func ValidateServiceScopeConfigs(scs []*meshv1alpha1.MeshConfig_ServiceScopeConfigs) error {
	for i, sc := range scs {
		for name, sel := range map[string]*meshv1alpha1.LabelSelector{
			"namespaceSelector": sc.GetNamespaceSelector(), "servicesSelector": sc.GetServicesSelector(),
		} {
			for j, r := range sel.GetMatchExpressions() {
				path := fmt.Sprintf("serviceScopeConfigs[%d].%s.matchExpressions[%d]", i, name, j)
				switch r.GetOperator() {
				case "In", "NotIn":
					if len(r.GetValues()) == 0 {
						return fmt.Errorf("%s: operator %s needs values", path, r.GetOperator())
					}
				case "Exists", "DoesNotExist":
					if len(r.GetValues()) != 0 {
						return fmt.Errorf("%s: operator %s takes no values", path, r.GetOperator())
					}
				default:
					return fmt.Errorf("%s: unknown operator %q (In, NotIn, Exists, DoesNotExist)", path, r.GetOperator())
				}
				if r.GetKey() == "" {
					return fmt.Errorf("%s: key is empty", path)
				}
			}
		}
	}
	return nil
}

// clusterNetwork is the network of workloads and VIPs without a network
// label of their own or their namespace's: Config.Network, else the label of
// the root (system) namespace, as istiod reads a cluster's network.
func (t *translator) clusterNetwork() string {
	if t.cfg.Network != "" {
		return t.cfg.Network
	}
	return t.nsLabels(t.cfg.RootNamespace)[LabelNetwork]
}
