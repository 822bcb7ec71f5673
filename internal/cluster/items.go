package cluster

import (
	"fmt"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Item is one object with its identity, for sources that track where each
// object came from (a file, an informer key).
type Item struct {
	Key string // "<Kind>/<namespace>/<name>"
	Obj any
}

// Items flattens o into keyed items.
func (o *Objects) Items() []Item {
	var out []Item
	add := func(kind string, n named, obj any) {
		out = append(out, Item{Key: fmt.Sprintf("%s/%s/%s", kind, n.GetNamespace(), n.GetName()), Obj: obj})
	}
	for _, v := range o.Namespaces {
		add("Namespace", v, v)
	}
	for _, v := range o.Pods {
		add("Pod", v, v)
	}
	for _, v := range o.Services {
		add("Service", v, v)
	}
	for _, v := range o.EndpointSlices {
		add("EndpointSlice", v, v)
	}
	for _, v := range o.ServiceEntries {
		add("ServiceEntry", v, v)
	}
	for _, v := range o.WorkloadEntries {
		add("WorkloadEntry", v, v)
	}
	for _, v := range o.AuthorizationPolicies {
		add("AuthorizationPolicy", v, v)
	}
	for _, v := range o.PeerAuthentications {
		add("PeerAuthentication", v, v)
	}
	for _, v := range o.Gateways {
		add("Gateway", v, v)
	}
	for _, v := range o.GatewayClasses {
		add("GatewayClass", v, v)
	}
	return out
}

// Add appends one object of a supported type to o.
func (o *Objects) Add(obj any) {
	switch v := obj.(type) {
	case *corev1.Namespace:
		o.Namespaces = append(o.Namespaces, v)
	case *corev1.Pod:
		o.Pods = append(o.Pods, v)
	case *corev1.Service:
		o.Services = append(o.Services, v)
	case *discoveryv1.EndpointSlice:
		o.EndpointSlices = append(o.EndpointSlices, v)
	case *networkingv1.ServiceEntry:
		o.ServiceEntries = append(o.ServiceEntries, v)
	case *networkingv1.WorkloadEntry:
		o.WorkloadEntries = append(o.WorkloadEntries, v)
	case *securityv1.AuthorizationPolicy:
		o.AuthorizationPolicies = append(o.AuthorizationPolicies, v)
	case *securityv1.PeerAuthentication:
		o.PeerAuthentications = append(o.PeerAuthentications, v)
	case *gatewayv1.Gateway:
		o.Gateways = append(o.Gateways, v)
	case *gatewayv1.GatewayClass:
		o.GatewayClasses = append(o.GatewayClasses, v)
	default:
		panic(fmt.Sprintf("cluster: Add of unsupported type %T", obj))
	}
}
