// Package synth builds synthetic but realistic clusters in memory for
// control-plane scale tests and benchmarks (translate's 50k-pod test,
// bench/cpscale): Deployments' pods spread over nodes and namespaces, one
// Service per ten pods with an EndpointSlice each, a share of ambient
// namespaces bound to a waypoint (each with an HTTPRoute for its first
// Service), one AuthorizationPolicy per namespace, and in every tenth
// namespace a ServiceEntry (an external API) and in another tenth a
// namespace-wide STRICT PeerAuthentication.
//
// Everything is derived from indexes, so the same Spec gives the same
// objects. It builds objects only; it does not translate or serve them.
package synth

import (
	"fmt"
	"net/netip"
	"sort"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// Spec sizes a synthetic cluster. Zero fields take the defaults of Default.
type Spec struct {
	Pods       int // total pods
	Nodes      int // pods are spread round-robin over node-0 … node-(Nodes-1)
	Namespaces int // pods are spread over ns-0 … ns-(Namespaces-1)
	// PodsPerService: each Service selects this many pods (one Deployment).
	PodsPerService int
	// AmbientEvery: every AmbientEvery-th namespace is ambient with a
	// waypoint (20: 5 % of namespaces, so 5 % of pods).
	AmbientEvery int
}

// Default is the shape the issue asks for: 100 nodes, 500 namespaces, a
// Service per 10 pods, 5 % ambient.
func Default(pods int) Spec {
	return Spec{Pods: pods, Nodes: 100, Namespaces: 500, PodsPerService: 10, AmbientEvery: 20}
}

func (s Spec) withDefaults() Spec {
	d := Default(s.Pods)
	if s.Nodes <= 0 {
		s.Nodes = d.Nodes
	}
	if s.Namespaces <= 0 {
		s.Namespaces = d.Namespaces
	}
	if s.PodsPerService <= 0 {
		s.PodsPerService = d.PodsPerService
	}
	if s.AmbientEvery <= 0 {
		s.AmbientEvery = d.AmbientEvery
	}
	return s
}

// Build returns the sorted object set for s.
func Build(s Spec) *cluster.Objects {
	s = s.withDefaults()
	objs := &cluster.Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{{
			ObjectMeta: metav1.ObjectMeta{Name: "istio-waypoint"},
			Spec:       gatewayv1.GatewayClassSpec{ControllerName: "istio.io/waypoint-controller"},
		}},
	}
	for n := 0; n < s.Namespaces; n++ {
		if s.ambient(n) {
			objs.Gateways = append(objs.Gateways, waypoint(NamespaceName(n), n))
		}
		objs.Namespaces = append(objs.Namespaces, Namespace(s, n, 0))
		objs.AuthorizationPolicies = append(objs.AuthorizationPolicies, Policy(s, n, 0))
		if s.ambient(n) && n < (s.Pods+s.PodsPerService-1)/s.PodsPerService {
			objs.HTTPRoutes = append(objs.HTTPRoutes, Route(s, n, 0))
		}
		if n%10 == 1 {
			objs.ServiceEntries = append(objs.ServiceEntries, ServiceEntry(s, n, 0))
		}
		if n%10 == 2 {
			objs.PeerAuthentications = append(objs.PeerAuthentications, PeerAuthentication(s, n, 0))
		}
	}
	// Deployments are dealt to namespaces round-robin; pod i belongs to
	// deployment i / PodsPerService.
	deployments := (s.Pods + s.PodsPerService - 1) / s.PodsPerService
	var deployPods [][]*corev1.Pod
	for d := 0; d < deployments; d++ {
		deployPods = append(deployPods, nil)
	}
	for i := 0; i < s.Pods; i++ {
		d := i / s.PodsPerService
		p := Pod(s, i, 0)
		objs.Pods = append(objs.Pods, p)
		deployPods[d] = append(deployPods[d], p)
	}
	for d := 0; d < deployments; d++ {
		svc, es := service(s, d, deployPods[d])
		objs.Services = append(objs.Services, svc)
		objs.EndpointSlices = append(objs.EndpointSlices, es)
	}
	objs.Sort()
	return objs
}

func (s Spec) ambient(n int) bool { return n%s.AmbientEvery == 0 }

// NamespaceName is the name of namespace n.
func NamespaceName(n int) string { return fmt.Sprintf("ns-%d", n) }

// DeploymentName is the name of deployment d (and of its Service).
func DeploymentName(d int) string { return fmt.Sprintf("svc-%d", d) }

func (s Spec) namespaceOf(deployment int) int { return deployment % s.Namespaces }

// Pod returns pod i of s. gen varies the pod without changing its identity
// (a label and readiness flip), which is what churn does; gen 0 is the
// initial pod.
func Pod(s Spec, i, gen int) *corev1.Pod {
	s = s.withDefaults()
	d := i / s.PodsPerService
	ns := NamespaceName(s.namespaceOf(d))
	dep := DeploymentName(d)
	hash := fmt.Sprintf("%08x", uint32(d)*2654435761)
	ctrl := true
	ready := corev1.ConditionTrue
	if gen%2 == 1 {
		ready = corev1.ConditionFalse
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s-%s-%05d", dep, hash[:5], i),
			Namespace: ns,
			UID:       types.UID(fmt.Sprint("uid-", i)),
			Labels: map[string]string{
				"app": dep, "version": "v1", "pod-template-hash": hash,
				// The workload's canonical revision names the generation,
				// so a node proxy can tell which change it holds.
				"service.istio.io/canonical-revision": Revision(gen),
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: dep + "-" + hash, Controller: &ctrl,
			}},
		},
		Spec: corev1.PodSpec{
			NodeName:           fmt.Sprintf("node-%d", i%s.Nodes),
			ServiceAccountName: dep,
			Containers: []corev1.Container{{
				Name: "app", Image: "app:v1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			}},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      PodIP(i).String(),
			PodIPs:     []corev1.PodIP{{IP: PodIP(i).String()}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}},
		},
	}
}

// Revision is the canonical revision of a pod at generation gen.
func Revision(gen int) string { return fmt.Sprintf("r%d", gen) }

// PodIP is pod i's address in 10.0.0.0/8 (up to 16M pods).
func PodIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

func serviceIP(d int) netip.Addr {
	return netip.AddrFrom4([4]byte{172, 16 + byte(d>>16), byte(d >> 8), byte(d)})
}

func service(s Spec, d int, pods []*corev1.Pod) (*corev1.Service, *discoveryv1.EndpointSlice) {
	ns := NamespaceName(s.namespaceOf(d))
	name := DeploymentName(d)
	vip := serviceIP(d).String()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector:   map[string]string{"app": name},
			ClusterIP:  vip,
			ClusterIPs: []string{vip},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{
				Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http"),
			}},
		},
	}
	portName, port, proto := "http", int32(8080), corev1.ProtocolTCP
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name + "-abcde", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: name},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
	}
	for _, p := range pods {
		ready := true
		node := p.Spec.NodeName
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name},
		})
	}
	return svc, es
}

func waypoint(ns string, n int) *gatewayv1.Gateway {
	ip := gatewayv1.IPAddressType
	return &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "waypoint", Namespace: ns,
			Labels: map[string]string{"istio.io/waypoint-for": "service"}},
		Spec: gatewayv1.GatewaySpec{
			GatewayClassName: "istio-waypoint",
			Listeners:        []gatewayv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}},
		},
		Status: gatewayv1.GatewayStatus{Addresses: []gatewayv1.GatewayStatusAddress{{
			Type: &ip, Value: netip.AddrFrom4([4]byte{172, 31, byte(n >> 8), byte(n)}).String(),
		}}},
	}
}

// Policy is namespace n's one AuthorizationPolicy: ALLOW to the pods of
// the namespace's Services from the same namespace on port 8080, selecting
// on a label every pod has (so it lands on every workload's policy list).
// An odd gen selects version v2, which no pod has: the namespace's
// workloads lose it.
func Policy(s Spec, n, gen int) *securityv1.AuthorizationPolicy {
	ns := NamespaceName(n)
	version := "v1"
	if gen%2 == 1 {
		version = "v2"
	}
	return &securityv1.AuthorizationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-same-ns", Namespace: ns},
		Spec: securityv1beta1.AuthorizationPolicy{
			Selector: &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"version": version}},
			Action:   securityv1beta1.AuthorizationPolicy_ALLOW,
			Rules: []*securityv1beta1.Rule{{
				From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{Namespaces: []string{ns}}}},
				To:   []*securityv1beta1.Rule_To{{Operation: &securityv1beta1.Operation{Ports: []string{"8080"}}}},
			}},
		},
	}
}

// Namespace is namespace n at generation gen: an odd gen flips its
// dataplane mode (an ambient namespace leaves the mesh, another joins), so
// every workload of it changes.
func Namespace(s Spec, n, gen int) *corev1.Namespace {
	s = s.withDefaults()
	labels := map[string]string{"team": fmt.Sprintf("t%d", n%17)}
	ambient := s.ambient(n) != (gen%2 == 1)
	if ambient {
		labels["istio.io/dataplane-mode"] = "ambient"
	}
	if s.ambient(n) {
		labels["istio.io/use-waypoint"] = "waypoint"
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: NamespaceName(n), Labels: labels}}
}

// ServiceEntry is namespace n's external API (in every tenth namespace):
// api-<n>.example.com, resolved by DNS, on 443, or 8443 for an odd gen.
func ServiceEntry(s Spec, n, gen int) *networkingv1.ServiceEntry {
	port := uint32(443)
	if gen%2 == 1 {
		port = 8443
	}
	return &networkingv1.ServiceEntry{
		ObjectMeta: metav1.ObjectMeta{Name: "external-api", Namespace: NamespaceName(n)},
		Spec: networkingv1alpha3.ServiceEntry{
			Hosts:      []string{fmt.Sprintf("api-%d.example.com", n)},
			Location:   networkingv1alpha3.ServiceEntry_MESH_EXTERNAL,
			Resolution: networkingv1alpha3.ServiceEntry_DNS,
			Ports:      []*networkingv1alpha3.ServicePort{{Number: port, Name: "tls", Protocol: "TLS"}},
		},
	}
}

// PeerAuthentication is namespace n's namespace-wide mTLS mode (in every
// tenth namespace): STRICT, or PERMISSIVE for an odd gen.
func PeerAuthentication(s Spec, n, gen int) *securityv1.PeerAuthentication {
	mode := securityv1beta1.PeerAuthentication_MutualTLS_STRICT
	if gen%2 == 1 {
		mode = securityv1beta1.PeerAuthentication_MutualTLS_PERMISSIVE
	}
	return &securityv1.PeerAuthentication{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: NamespaceName(n)},
		Spec:       securityv1beta1.PeerAuthentication{Mtls: &securityv1beta1.PeerAuthentication_MutualTLS{Mode: mode}},
	}
}

// Route is the HTTPRoute of ambient namespace n's first Service (the
// deployment numbered n): a path prefix /v<gen> goes to it, with a 1 s
// timeout, through the namespace's waypoint.
func Route(s Spec, n, gen int) *gatewayv1.HTTPRoute {
	svc := DeploymentName(n)
	group, kind := gatewayv1.Group(""), gatewayv1.Kind("Service")
	port := gatewayv1.PortNumber(80)
	prefix, path := gatewayv1.PathMatchPathPrefix, fmt.Sprintf("/v%d", gen)
	timeout := gatewayv1.Duration("1s")
	return &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: NamespaceName(n)},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{
				Group: &group, Kind: &kind, Name: gatewayv1.ObjectName(svc),
			}}},
			Rules: []gatewayv1.HTTPRouteRule{{
				Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: &prefix, Value: &path}}},
				BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
					BackendObjectReference: gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(svc), Port: &port},
				}}},
				Timeouts: &gatewayv1.HTTPRouteTimeouts{Request: &timeout},
			}},
		},
	}
}

// AmbientNamespaces lists the namespaces of s with a waypoint and an
// HTTPRoute; ServiceEntryNamespaces and PeerAuthnNamespaces those with a
// ServiceEntry and with a PeerAuthentication.
func AmbientNamespaces(s Spec) []int {
	s = s.withDefaults()
	return every(s, func(n int) bool { return s.ambient(n) && n < (s.Pods+s.PodsPerService-1)/s.PodsPerService })
}

func ServiceEntryNamespaces(s Spec) []int { return every(s, func(n int) bool { return n%10 == 1 }) }

func PeerAuthnNamespaces(s Spec) []int { return every(s, func(n int) bool { return n%10 == 2 }) }

func every(s Spec, f func(int) bool) []int {
	s = s.withDefaults()
	var out []int
	for n := 0; n < s.Namespaces; n++ {
		if f(n) {
			out = append(out, n)
		}
	}
	return out
}

// With returns a copy of objs (sharing every object) in which the object of
// the slice field picks that has o's namespace and name is replaced by o,
// the way a Source publishes after one update. It panics when there is no
// such object.
func With[T interface {
	comparable
	GetNamespace() string
	GetName() string
}](objs *cluster.Objects, field func(*cluster.Objects) *[]T, o T) *cluster.Objects {
	next := *objs
	s := field(&next)
	*s = append([]T(nil), *s...)
	for i, cur := range *s {
		if cur.GetNamespace() == o.GetNamespace() && cur.GetName() == o.GetName() {
			(*s)[i] = o
			return &next
		}
	}
	panic(fmt.Sprintf("synth: %s/%s not in the set", o.GetNamespace(), o.GetName()))
}

// WithPod returns a copy of objs (sharing every object) with pod i replaced
// by Pod(s, i, gen), the way a Source publishes after one pod update.
func WithPod(objs *cluster.Objects, s Spec, i, gen int) *cluster.Objects {
	p := Pod(s, i, gen)
	next := *objs
	next.Pods = append([]*corev1.Pod(nil), objs.Pods...)
	j := sort.Search(len(next.Pods), func(j int) bool {
		q := next.Pods[j]
		return q.Namespace > p.Namespace || q.Namespace == p.Namespace && q.Name >= p.Name
	})
	if j < len(next.Pods) && next.Pods[j].Namespace == p.Namespace && next.Pods[j].Name == p.Name {
		next.Pods[j] = p
		return &next
	}
	panic(fmt.Sprintf("synth: pod %d not in the set", i))
}
