// Package cluster holds the Kubernetes, Istio and Gateway API objects that
// ztunnel-go reads from a cluster, as typed client-go objects gathered into
// an immutable Objects set, and the Source interface that publishes one set
// after another.
//
// Several parts of the project read these sets:
//   - ztunnel-cp translates them into the Workload API resources it serves
//     (internal/controlplane/translate); in local mode cmd/ztunnel embeds the
//     same control plane.
//   - The node agent (cni/agent) watches only namespaces and the pods of its
//     own node, to decide which pods to capture.
//   - The xDS benchmark (bench/xds) and the test harness
//     (internal/testing/meshlab) build or decode sets to drive the two above.
//
// Two sources produce sets: package cluster/local reads a directory of YAML
// (through Decode) and package cluster/kube watches the Kubernetes API with
// client-go informers. Kinds is the one table of the object kinds that
// Decode, Objects and both sources handle.
//
// The package translates nothing into mesh resources (see
// internal/controlplane/translate) and writes nothing to the API server.
package cluster

import (
	"context"
	"sort"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	telemetryv1 "istio.io/client-go/pkg/apis/telemetry/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Objects is one consistent view of everything the control plane reads. A
// set is never mutated after a Source publishes it; the slices are sorted by
// namespace/name so translation output is deterministic.
type Objects struct {
	Namespaces            []*corev1.Namespace
	Pods                  []*corev1.Pod
	Services              []*corev1.Service
	EndpointSlices        []*discoveryv1.EndpointSlice
	ServiceEntries        []*networkingv1.ServiceEntry
	WorkloadEntries       []*networkingv1.WorkloadEntry
	AuthorizationPolicies []*securityv1.AuthorizationPolicy
	PeerAuthentications   []*securityv1.PeerAuthentication
	Gateways              []*gatewayv1.Gateway
	GatewayClasses        []*gatewayv1.GatewayClass
	// RequestAuthentications (JWT rules) with targetRefs to a waypoint or
	// a service it serves are enforced by that waypoint of ours.
	RequestAuthentications []*securityv1.RequestAuthentication
	// HTTPRoutes and GRPCRoutes attached to a Service or ServiceEntry
	// (parentRefs) route the requests a waypoint of ours handles for it.
	HTTPRoutes []*gatewayv1.HTTPRoute
	GRPCRoutes []*gatewayv1.GRPCRoute
	// ReferenceGrants permit a route's backendRefs (and RequestMirror
	// backends) to name a Service or ServiceEntry in the grant's namespace;
	// without one such a cross-namespace reference is refused.
	ReferenceGrants []*gatewayv1.ReferenceGrant
	// VirtualServices and DestinationRules route and balance the requests a
	// waypoint of ours handles for a service their hosts name.
	VirtualServices  []*networkingv1.VirtualService
	DestinationRules []*networkingv1.DestinationRule
	// Telemetries (telemetry.istio.io) configure the access logs, metrics
	// and tracing of the waypoints of ours they apply to.
	Telemetries []*telemetryv1.Telemetry
	// Nodes give pods their locality (topology labels). Only the control
	// plane reads them; the node agent's source leaves this empty.
	Nodes []*corev1.Node
	// Secrets carry the certificates a DestinationRule's tls.credentialName
	// names (TLS origination at a waypoint). Sources keep only the data
	// keys of Istio's TLS Secret formats (CredentialKeys).
	Secrets []*corev1.Secret
	// Ignored are objects of kinds the control plane does not read
	// (ignoredKinds), kept to be reported. Only Decode fills it.
	Ignored []*IgnoredObject
}

// CredentialKeys are the data keys of a Secret a DestinationRule's
// credentialName may name, in Istio's two formats: kubernetes.io/tls
// (tls.crt, tls.key, ca.crt) and generic (cert, key, cacert). A source
// keeps no other key of any Secret.
var CredentialKeys = []string{"tls.crt", "tls.key", "ca.crt", "cert", "key", "cacert"}

// Source produces successive Objects sets. Implementations are safe for
// concurrent use.
type Source interface {
	// Run watches the cluster until ctx is done.
	Run(ctx context.Context) error
	// Current returns the latest set and a channel closed when a newer one is
	// published. Before the first full read it returns (nil, ch).
	Current() (*Objects, <-chan struct{})
}

type named interface {
	GetNamespace() string
	GetName() string
}

func sortByName[T named](s []T) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].GetNamespace() != s[j].GetNamespace() {
			return s[i].GetNamespace() < s[j].GetNamespace()
		}
		return s[i].GetName() < s[j].GetName()
	})
}

// Namespace returns the named namespace or nil.
func (o *Objects) Namespace(name string) *corev1.Namespace {
	for _, n := range o.Namespaces {
		if n.Name == name {
			return n
		}
	}
	return nil
}
