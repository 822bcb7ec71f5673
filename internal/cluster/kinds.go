package cluster

import (
	"fmt"
	"reflect"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	telemetryv1 "istio.io/client-go/pkg/apis/telemetry/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Kind describes one kind of object an Objects set carries: where it sits
// in the Kubernetes API, how a document of it is decoded, and which slice of
// Objects holds it. Decode, Add, Items and Sort, and the informers of
// cluster/kube, all work from the one table Kinds returns, so a new kind is
// a row there plus its Objects field.
type Kind struct {
	// GroupVersion is the API group and version of the Go type. Decode
	// accepts a document of any version of the group.
	GroupVersion schema.GroupVersion
	// Name is the kind ("Pod"); Resource is its REST resource ("pods").
	Name, Resource string
	// Namespaced kinds get the namespace "default" when a document has none.
	Namespaced bool

	goType reflect.Type
	decode func(js []byte) (metav1.Object, error)
	add    func(o *Objects, obj any)
	each   func(o *Objects, fn func(metav1.Object))
	sort   func(o *Objects)
}

// GroupVersionResource names the kind's REST resource.
func (k Kind) GroupVersionResource() schema.GroupVersionResource {
	return k.GroupVersion.WithResource(k.Resource)
}

const (
	namespaced    = true
	clusterScoped = false
)

// kinds is the table, in the order Items lists objects.
var kinds = []Kind{
	kindOf(corev1.SchemeGroupVersion, "Namespace", "namespaces", clusterScoped,
		func(o *Objects) *[]*corev1.Namespace { return &o.Namespaces }, strictAs),
	kindOf(corev1.SchemeGroupVersion, "Pod", "pods", namespaced,
		func(o *Objects) *[]*corev1.Pod { return &o.Pods }, strictAs),
	kindOf(corev1.SchemeGroupVersion, "Service", "services", namespaced,
		func(o *Objects) *[]*corev1.Service { return &o.Services }, strictAs),
	kindOf(discoveryv1.SchemeGroupVersion, "EndpointSlice", "endpointslices", namespaced,
		func(o *Objects) *[]*discoveryv1.EndpointSlice { return &o.EndpointSlices }, strictAs),
	kindOf(networkingv1.SchemeGroupVersion, "ServiceEntry", "serviceentries", namespaced,
		func(o *Objects) *[]*networkingv1.ServiceEntry { return &o.ServiceEntries },
		func(js []byte, v *networkingv1.ServiceEntry) error { return strictIstio(js, v, &v.Spec, &v.Status) }),
	kindOf(networkingv1.SchemeGroupVersion, "WorkloadEntry", "workloadentries", namespaced,
		func(o *Objects) *[]*networkingv1.WorkloadEntry { return &o.WorkloadEntries },
		func(js []byte, v *networkingv1.WorkloadEntry) error { return strictIstio(js, v, &v.Spec, &v.Status) }),
	kindOf(securityv1.SchemeGroupVersion, "AuthorizationPolicy", "authorizationpolicies", namespaced,
		func(o *Objects) *[]*securityv1.AuthorizationPolicy { return &o.AuthorizationPolicies },
		func(js []byte, v *securityv1.AuthorizationPolicy) error {
			return strictIstio(js, v, &v.Spec, &v.Status)
		}),
	kindOf(securityv1.SchemeGroupVersion, "PeerAuthentication", "peerauthentications", namespaced,
		func(o *Objects) *[]*securityv1.PeerAuthentication { return &o.PeerAuthentications },
		func(js []byte, v *securityv1.PeerAuthentication) error { return strictIstio(js, v, &v.Spec, &v.Status) }),
	kindOf(securityv1.SchemeGroupVersion, "RequestAuthentication", "requestauthentications", namespaced,
		func(o *Objects) *[]*securityv1.RequestAuthentication { return &o.RequestAuthentications },
		func(js []byte, v *securityv1.RequestAuthentication) error {
			return strictIstio(js, v, &v.Spec, &v.Status)
		}),
	kindOf(gatewayv1.SchemeGroupVersion, "Gateway", "gateways", namespaced,
		func(o *Objects) *[]*gatewayv1.Gateway { return &o.Gateways }, strictAs),
	kindOf(gatewayv1.SchemeGroupVersion, "GatewayClass", "gatewayclasses", clusterScoped,
		func(o *Objects) *[]*gatewayv1.GatewayClass { return &o.GatewayClasses }, strictAs),
	kindOf(gatewayv1.SchemeGroupVersion, "HTTPRoute", "httproutes", namespaced,
		func(o *Objects) *[]*gatewayv1.HTTPRoute { return &o.HTTPRoutes }, strictAs),
	kindOf(gatewayv1.SchemeGroupVersion, "GRPCRoute", "grpcroutes", namespaced,
		func(o *Objects) *[]*gatewayv1.GRPCRoute { return &o.GRPCRoutes }, strictAs),
	kindOf(gatewayv1.SchemeGroupVersion, "ReferenceGrant", "referencegrants", namespaced,
		func(o *Objects) *[]*gatewayv1.ReferenceGrant { return &o.ReferenceGrants }, strictAs),
	kindOf(networkingv1.SchemeGroupVersion, "VirtualService", "virtualservices", namespaced,
		func(o *Objects) *[]*networkingv1.VirtualService { return &o.VirtualServices },
		func(js []byte, v *networkingv1.VirtualService) error { return strictIstio(js, v, &v.Spec, &v.Status) }),
	kindOf(networkingv1.SchemeGroupVersion, "DestinationRule", "destinationrules", namespaced,
		func(o *Objects) *[]*networkingv1.DestinationRule { return &o.DestinationRules },
		func(js []byte, v *networkingv1.DestinationRule) error { return strictIstio(js, v, &v.Spec, &v.Status) }),
	kindOf(telemetryv1.SchemeGroupVersion, "Telemetry", "telemetries", namespaced,
		func(o *Objects) *[]*telemetryv1.Telemetry { return &o.Telemetries },
		func(js []byte, v *telemetryv1.Telemetry) error { return strictIstio(js, v, &v.Spec, &v.Status) }),
	kindOf(corev1.SchemeGroupVersion, "Node", "nodes", clusterScoped,
		func(o *Objects) *[]*corev1.Node { return &o.Nodes }, strictAs),
	kindOf(corev1.SchemeGroupVersion, "Secret", "secrets", namespaced,
		func(o *Objects) *[]*corev1.Secret { return &o.Secrets }, decodeSecret),
}

// decodeSecret decodes a Secret as the API server stores it: stringData
// merged into data (stringData wins), then dropped.
func decodeSecret(js []byte, v *corev1.Secret) error {
	if err := strict(js, v); err != nil {
		return err
	}
	for k, s := range v.StringData {
		if v.Data == nil {
			v.Data = map[string][]byte{}
		}
		v.Data[k] = []byte(s)
	}
	v.StringData = nil
	return nil
}

var (
	byGroupKind = map[schema.GroupKind]*Kind{}
	byType      = map[reflect.Type]*Kind{}
)

func init() {
	for i := range kinds {
		k := &kinds[i]
		byGroupKind[schema.GroupKind{Group: k.GroupVersion.Group, Kind: k.Name}] = k
		byType[k.goType] = k
	}
}

// Kinds returns every kind an Objects set carries, in the order Items
// lists them.
func Kinds() []Kind { return append([]Kind(nil), kinds...) }

// kindOf builds a table row for the Go type T (a pointer to E) held in the
// slice field returns. decode fills a new T from a document's JSON.
func kindOf[E any, T interface {
	*E
	metav1.Object
}](gv schema.GroupVersion, name, resource string, ns bool, field func(*Objects) *[]T, decode func(js []byte, v T) error) Kind {
	return Kind{
		GroupVersion: gv, Name: name, Resource: resource, Namespaced: ns,
		goType: reflect.TypeFor[T](),
		decode: func(js []byte) (metav1.Object, error) {
			v := T(new(E))
			if err := decode(js, v); err != nil {
				return nil, err
			}
			return v, nil
		},
		add: func(o *Objects, obj any) {
			s := field(o)
			*s = append(*s, obj.(T))
		},
		each: func(o *Objects, fn func(metav1.Object)) {
			for _, v := range *field(o) {
				fn(v)
			}
		},
		sort: func(o *Objects) { sortByName(*field(o)) },
	}
}

// Item is one object with its identity, for sources that track where each
// object came from (a file, an informer key).
type Item struct {
	Key string // "<Kind>/<namespace>/<name>"
	Obj any
}

// Items flattens o into keyed items, kind by kind in the order of Kinds.
func (o *Objects) Items() []Item {
	var out []Item
	for i := range kinds {
		k := &kinds[i]
		k.each(o, func(v metav1.Object) {
			out = append(out, Item{Key: fmt.Sprintf("%s/%s/%s", k.Name, v.GetNamespace(), v.GetName()), Obj: v})
		})
	}
	return append(out, o.ignoredItems()...)
}

// Add appends one object of a supported type (a pointer to one of the
// typed objects of Kinds) to o. It panics on any other type: that is a
// programming error, not bad input.
func (o *Objects) Add(obj any) {
	if v, ok := obj.(*IgnoredObject); ok {
		o.Ignored = append(o.Ignored, v)
		return
	}
	k := byType[reflect.TypeOf(obj)]
	if k == nil {
		panic(fmt.Sprintf("cluster: Add of unsupported type %T", obj))
	}
	k.add(o, obj)
}

// Sort orders every slice by namespace/name.
func (o *Objects) Sort() {
	for i := range kinds {
		kinds[i].sort(o)
	}
	o.sortIgnored()
}
