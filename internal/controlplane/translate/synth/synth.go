// Package synth builds synthetic but realistic clusters in memory for
// control-plane scale tests and benchmarks (translate's 50k-pod test,
// bench/cpscale): Deployments' pods spread over nodes and namespaces, one
// Service per ten pods with an EndpointSlice each, a share of ambient
// namespaces bound to a waypoint, and one AuthorizationPolicy per namespace.
//
// Everything is derived from indexes, so the same Spec gives the same
// objects. It builds objects only; it does not translate or serve them.
package synth

import (
	"fmt"
	"net/netip"
	"sort"

	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
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
		ns := NamespaceName(n)
		labels := map[string]string{"team": fmt.Sprintf("t%d", n%17)}
		if s.ambient(n) {
			labels["istio.io/dataplane-mode"] = "ambient"
			labels["istio.io/use-waypoint"] = "waypoint"
			objs.Gateways = append(objs.Gateways, waypoint(ns, n))
		}
		objs.Namespaces = append(objs.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}})
		objs.AuthorizationPolicies = append(objs.AuthorizationPolicies, policy(ns))
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

// policy is the namespace's one AuthorizationPolicy: ALLOW to the pods of
// the namespace's Services from the same namespace on port 8080, selecting
// on a label every pod has (so it lands on every workload's policy list).
func policy(ns string) *securityv1.AuthorizationPolicy {
	return &securityv1.AuthorizationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-same-ns", Namespace: ns},
		Spec: securityv1beta1.AuthorizationPolicy{
			Selector: &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"version": "v1"}},
			Action:   securityv1beta1.AuthorizationPolicy_ALLOW,
			Rules: []*securityv1beta1.Rule{{
				From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{Namespaces: []string{ns}}}},
				To:   []*securityv1beta1.Rule_To{{Operation: &securityv1beta1.Operation{Ports: []string{"8080"}}}},
			}},
		},
	}
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
