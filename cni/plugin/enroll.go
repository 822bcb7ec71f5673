package plugin

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Labels and annotations of the enrollment rule (docs/protocol.md#capture-rules).
const (
	LabelDataplaneMode         = "istio.io/dataplane-mode"
	DataplaneModeAmbient       = "ambient"
	DataplaneModeNone          = "none"
	AnnotationSidecarStatus    = "sidecar.istio.io/status"
	DefaultSystemNamespace     = "istio-system"
	labelApp                   = "app"
	reasonHostNetwork          = "hostNetwork pod"
	reasonSidecar              = "sidecar-injected pod (" + AnnotationSidecarStatus + ")"
	reasonExcludedNamespace    = "namespace is in exclude_namespaces"
	reasonMeshComponent        = "mesh component pod (node proxy or CNI agent)"
	reasonOptOut               = "pod label " + LabelDataplaneMode + "=" + DataplaneModeNone
	reasonPodLabel             = "pod label " + LabelDataplaneMode + "=" + DataplaneModeAmbient
	reasonNamespaceLabel       = "namespace label " + LabelDataplaneMode + "=" + DataplaneModeAmbient
	reasonNotEnrolled          = "neither pod nor namespace is labelled " + LabelDataplaneMode + "=" + DataplaneModeAmbient
	reasonNoPod                = "pod unknown"
	reasonAmbientNamespaceOnly = "namespace is ambient but the pod is unknown"
)

// meshComponentApps are the app label values of our own pods in the system
// namespace: they run the capture and are never captured themselves.
var meshComponentApps = []string{"ztunnel", "ztunnel-cni", "istio-cni-node"}

// Enrollment holds the node-wide inputs of the enrollment rule.
type Enrollment struct {
	// ExcludeNamespaces are never captured.
	ExcludeNamespaces []string
	// SystemNamespace holds the mesh's own pods (node proxy, CNI agent), which
	// are never captured; "" means DefaultSystemNamespace.
	SystemNamespace string
}

// IsAmbient reports whether pod is captured into the ambient mesh, and why
// (a short phrase for logs). ns is the pod's Namespace; nil means its labels
// are unknown (treated as none). A nil pod is never ambient.
//
// The rule, first match wins:
//   - hostNetwork pods, sidecar-injected pods (annotation
//     sidecar.istio.io/status), pods in ExcludeNamespaces and the mesh's own
//     pods (label app=ztunnel|ztunnel-cni|istio-cni-node in SystemNamespace)
//     are not ambient;
//   - pod label istio.io/dataplane-mode=none opts out;
//   - pod label istio.io/dataplane-mode=ambient, or the namespace's label
//     istio.io/dataplane-mode=ambient, enrolls.
func IsAmbient(pod *corev1.Pod, ns *corev1.Namespace, e Enrollment) (bool, string) {
	if pod == nil {
		return false, reasonNoPod
	}
	sysNS := e.SystemNamespace
	if sysNS == "" {
		sysNS = DefaultSystemNamespace
	}
	switch {
	case pod.Spec.HostNetwork:
		return false, reasonHostNetwork
	case hasKey(pod.Annotations, AnnotationSidecarStatus):
		return false, reasonSidecar
	case slices.Contains(e.ExcludeNamespaces, pod.Namespace):
		return false, reasonExcludedNamespace
	case pod.Namespace == sysNS && slices.Contains(meshComponentApps, pod.Labels[labelApp]):
		return false, reasonMeshComponent
	case pod.Labels[LabelDataplaneMode] == DataplaneModeNone:
		return false, reasonOptOut
	case pod.Labels[LabelDataplaneMode] == DataplaneModeAmbient:
		return true, reasonPodLabel
	case ns != nil && ns.Labels[LabelDataplaneMode] == DataplaneModeAmbient:
		return true, reasonNamespaceLabel
	}
	return false, reasonNotEnrolled
}

// namespaceAmbient reports whether pods in ns would be captured by the
// namespace label alone: the fail-closed test for a pod the metadata source
// does not know (yet).
func namespaceAmbient(namespace string, ns *corev1.Namespace, e Enrollment) bool {
	return ns != nil && ns.Labels[LabelDataplaneMode] == DataplaneModeAmbient &&
		!slices.Contains(e.ExcludeNamespaces, namespace)
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}
