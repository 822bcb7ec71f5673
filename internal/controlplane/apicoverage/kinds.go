package apicoverage

import (
	"reflect"
	"sort"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"istio.io/api/annotation"
	"istio.io/api/label"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	telemetryv1alpha1 "istio.io/api/telemetry/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
)

// Kind is one API kind whose fields the table must cover.
type Kind struct {
	// Name is the kind as users write it ("AuthorizationPolicy").
	Name string
	// Group is its API group ("" for core).
	Group string
	// fields lists the spec's field paths, from the API module's own
	// descriptors or Go types.
	fields func() []string
}

// Fields lists every field path the kind's API defines: the spec's fields
// from the API module's own descriptors or Go types, then one
// metadata.labels[...] or metadata.annotations[...] path for each Istio
// label and annotation that istio.io/api says applies to the kind.
func (k Kind) Fields() []string {
	out := k.fields()
	for _, a := range annotation.AllResourceAnnotations() {
		if appliesTo(a.Resources, k.Name) {
			out = append(out, "metadata.annotations["+a.Name+"]")
		}
	}
	for _, l := range label.AllResourceLabels() {
		if labelAppliesTo(l.Resources, k.Name) {
			out = append(out, "metadata.labels["+l.Name+"]")
		}
	}
	sort.Strings(out)
	return out
}

// appliesTo is true when one of the annotation's resource types is the
// kind. Annotations for "Any" resource are left out: they are about
// tooling (analysis suppression, installer bookkeeping), listed nowhere.
func appliesTo(rs []annotation.ResourceTypes, kind string) bool {
	for _, r := range rs {
		if r.String() == kind {
			return true
		}
	}
	return false
}

func labelAppliesTo(rs []label.ResourceTypes, kind string) bool {
	for _, r := range rs {
		if r.String() == kind {
			return true
		}
	}
	return false
}

func protoKind(group, name string, m protoreflect.ProtoMessage) Kind {
	return Kind{Name: name, Group: group, fields: func() []string {
		return protoFields("spec", m.ProtoReflect().Descriptor())
	}}
}

func goKind(group, name, prefix string, v any) Kind {
	return Kind{Name: name, Group: group, fields: func() []string {
		var out []string
		for _, f := range goFields(prefix, reflect.TypeOf(v)) {
			// An object's type and metadata are the API server's.
			if prefix == "" && (f == "kind" || f == "apiVersion" || strings.HasPrefix(f, "metadata")) {
				continue
			}
			out = append(out, f)
		}
		return out
	}}
}

// Kinds lists every kind the control plane reads (and the ones it reads
// only to report that they have no effect), in the order of the document.
func Kinds() []Kind {
	return []Kind{
		protoKind("security.istio.io", "AuthorizationPolicy", &securityv1beta1.AuthorizationPolicy{}),
		protoKind("security.istio.io", "PeerAuthentication", &securityv1beta1.PeerAuthentication{}),
		protoKind("security.istio.io", "RequestAuthentication", &securityv1beta1.RequestAuthentication{}),
		protoKind("networking.istio.io", "ServiceEntry", &networkingv1alpha3.ServiceEntry{}),
		protoKind("networking.istio.io", "WorkloadEntry", &networkingv1alpha3.WorkloadEntry{}),
		protoKind("networking.istio.io", "VirtualService", &networkingv1alpha3.VirtualService{}),
		protoKind("networking.istio.io", "DestinationRule", &networkingv1alpha3.DestinationRule{}),
		protoKind("networking.istio.io", "Sidecar", &networkingv1alpha3.Sidecar{}),
		protoKind("telemetry.istio.io", "Telemetry", &telemetryv1alpha1.Telemetry{}),
		goKind("gateway.networking.k8s.io", "Gateway", "spec", gatewayv1.GatewaySpec{}),
		goKind("gateway.networking.k8s.io", "GatewayClass", "spec", gatewayv1.GatewayClassSpec{}),
		goKind("gateway.networking.k8s.io", "HTTPRoute", "spec", gatewayv1.HTTPRouteSpec{}),
		goKind("gateway.networking.k8s.io", "GRPCRoute", "spec", gatewayv1.GRPCRouteSpec{}),
		goKind("gateway.networking.k8s.io", "ReferenceGrant", "spec", gatewayv1beta1.ReferenceGrantSpec{}),
		goKind("", "Service", "spec", corev1.ServiceSpec{}),
		goKind("discovery.k8s.io", "EndpointSlice", "", discoveryv1.EndpointSlice{}),
		goKind("", "Pod", "spec", corev1.PodSpec{}),
		goKind("", "Namespace", "spec", corev1.NamespaceSpec{}),
		goKind("", "Node", "spec", corev1.NodeSpec{}),
	}
}
