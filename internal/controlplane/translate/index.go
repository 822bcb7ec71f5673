package translate

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// Labels and annotations the translation reads (istio/api label registry).
const (
	LabelDataplaneMode        = "istio.io/dataplane-mode"
	AnnotationRedirection     = "ambient.istio.io/redirection"
	AnnotationSidecarStatus   = "sidecar.istio.io/status"
	LabelUseWaypoint          = "istio.io/use-waypoint"
	LabelUseWaypointNamespace = "istio.io/use-waypoint-namespace"
	LabelWaypointFor          = "istio.io/waypoint-for"
	LabelGatewayName          = "gateway.networking.k8s.io/gateway-name"
	// LabelGatewayManaged is on the objects a gateway controller deploys;
	// ManagedMeshController marks a waypoint's (istio/api's
	// gateway.istio.io/managed, value istio.io-mesh-controller).
	LabelGatewayManaged   = "gateway.istio.io/managed"
	ManagedMeshController = "istio.io-mesh-controller"
	LabelTunnel           = "networking.istio.io/tunnel"
	LabelNetwork          = "topology.istio.io/network"
	LabelSubzone          = "topology.istio.io/subzone"
	LabelRegion           = "topology.kubernetes.io/region"
	LabelZone             = "topology.kubernetes.io/zone"
	LabelLocality         = "istio-locality"
	LabelServiceName      = "kubernetes.io/service-name"
	LabelPodTemplateHash  = "pod-template-hash"
	AnnotationTrafficDist = "networking.istio.io/traffic-distribution"

	// AnnotationWaypointAddress is ztunnel-go's local-mode way to give a
	// waypoint Gateway its address when no controller writes
	// status.addresses: a comma-separated list of IPs. Lookup order:
	// status.addresses, then spec.addresses (IPAddress type), then this.
	AnnotationWaypointAddress = "ztunnel-go.io/waypoint-address"

	// WaypointClass is the GatewayClass of waypoints.
	WaypointClass = "istio-waypoint"
	// HBONEPort is the waypoint's HBONE listener port.
	HBONEPort = 15008
)

type waypoint struct {
	key  string // ns/name
	addr *workloadapi.GatewayAddress
	// forService / forWorkload: the traffic types it accepts.
	forService, forWorkload bool
	trafficType             string
	// binding is how the waypoint's own pods take traffic from their node
	// proxy (ambient.istio.io/waypoint-inbound-binding); nil: plain HBONE.
	binding *workloadapi.ApplicationTunnel
	// allowed decides which namespaces' objects may use it (waypoints.go).
	allowed allowedNamespaces
}

type index struct {
	namespaces map[string]*corev1.Namespace
	// svcByName: non-ExternalName Services by ns/name (empty when
	// svcSorted is set).
	svcByName map[string]*corev1.Service
	// svcSorted: the sorted Services, when an index without workloads
	// looks them up by binary search instead (service).
	svcSorted []*corev1.Service
	// svcSel: Services with a selector, by namespace, then by the first
	// (smallest) key of their selector, its value, then by name. A pod
	// finds the Services selecting it through its own labels in
	// O(labels), without building a string per label.
	svcSel map[string]map[string]map[string]map[string]*corev1.Service
	// svcHosts: "ns/hostname" of every non-ExternalName Service; a
	// ServiceEntry or ExternalName alias with the same key loses.
	svcHosts map[string]bool
	// seHosts: "ns/host" of ServiceEntry hosts and ExternalName Services,
	// the keys a Service change must not race against (it re-translates all).
	seHosts map[string]bool
	// seHostnames: bare ServiceEntry hosts (any namespace); a Service
	// with one of them decides which ServiceEntry is canonical.
	seHostnames map[string]bool
	// kubeHosts: hostnames of non-ExternalName Services.
	kubeHosts map[string]bool
	// seSel: ServiceEntries with a workloadSelector, by namespace.
	seSel map[string][]*networkingv1.ServiceEntry
	// meshHosts are the ServiceEntry hosts; with kubeHosts, the hostnames
	// of mesh services (isMeshHost).
	meshHosts map[string]bool
	// aliasTargets: targets of ExternalName Services (for change tracking).
	aliasTargets map[string]bool
	waypoints    map[string]*waypoint // by ns/name, only usable ones (with address)
	classes      map[string]*gatewayv1.GatewayClass
	pods         map[string]*corev1.Pod // ns/name
	// podsByNs: namespace → name → pod, for Service changes.
	podsByNs map[string]map[string]*corev1.Pod
	// slicesBySvc: ns/service-name label → slice key → slice.
	slicesBySvc map[string]map[string]*discoveryv1.EndpointSlice
	// podRefs: ns/pod-name → slice key → slice with an endpoint whose
	// targetRef is that Pod name (ns is the slice's).
	podRefs map[string]map[string]*discoveryv1.EndpointSlice
	// policiesByNs: WORKLOAD_SELECTOR authorizations by namespace, in the
	// order translateAuthorizationPolicies produced them.
	policiesByNs map[string][]selectorPolicy
	// wePerNs counts WorkloadEntries per namespace.
	wePerNs map[string]int
	// nodes: Node name → the locality of its topology labels (nil: none);
	// podsByNode: node name → ns/name → pod, for Node changes.
	nodes      map[string]*workloadapi.Locality
	podsByNode map[string]map[string]*corev1.Pod
}

func (t *translator) buildIndex() { t.buildIndexOf(true) }

// buildIndexOf builds the index; withWorkloads false leaves out the pods
// and EndpointSlices (pods, podsByNs, podsByNode, slicesBySvc, podRefs stay
// empty) and indexes Services by name only (svcSel, svcHosts, kubeHosts
// stay empty): what waypoint
// configs and route statuses need is the rest, and at 50k pods the rest
// takes most of the time.
func (t *translator) buildIndexOf(withWorkloads bool) {
	t.idx = index{
		namespaces:   map[string]*corev1.Namespace{},
		svcByName:    map[string]*corev1.Service{},
		svcSel:       map[string]map[string]map[string]map[string]*corev1.Service{},
		svcHosts:     map[string]bool{},
		seHosts:      map[string]bool{},
		seHostnames:  map[string]bool{},
		kubeHosts:    map[string]bool{},
		seSel:        map[string][]*networkingv1.ServiceEntry{},
		meshHosts:    map[string]bool{},
		aliasTargets: map[string]bool{},
		waypoints:    map[string]*waypoint{},
		classes:      map[string]*gatewayv1.GatewayClass{},
		pods:         map[string]*corev1.Pod{},
		podsByNs:     map[string]map[string]*corev1.Pod{},
		slicesBySvc:  map[string]map[string]*discoveryv1.EndpointSlice{},
		podRefs:      map[string]map[string]*discoveryv1.EndpointSlice{},
		policiesByNs: map[string][]selectorPolicy{},
		wePerNs:      map[string]int{},
		nodes:        make(map[string]*workloadapi.Locality, len(t.objs.Nodes)),
		podsByNode:   map[string]map[string]*corev1.Pod{},
	}
	for _, n := range t.objs.Nodes {
		t.idx.nodes[n.Name] = locality(n.Labels)
	}
	// Waypoint configs and route statuses look Services up by name only
	// (service): from a sorted set by binary search, else by svcByName;
	// the selector and host indexes are for pods.
	if !withWorkloads && (t.servicesSorted || slices.IsSortedFunc(t.objs.Services, less)) {
		t.idx.svcSorted = t.objs.Services
	}
	for _, s := range t.objs.Services {
		switch {
		case s.Spec.Type == corev1.ServiceTypeExternalName || t.idx.svcSorted != nil:
		case withWorkloads:
			t.idx.addService(s, t.serviceHostname(s))
		default:
			t.idx.svcByName[s.Namespace+"/"+s.Name] = s
		}
	}
	t.indexGlobal()
	if !withWorkloads {
		return
	}
	t.idx.pods = make(map[string]*corev1.Pod, len(t.objs.Pods))
	for _, p := range t.objs.Pods {
		t.idx.addPod(p)
	}
	for _, es := range t.objs.EndpointSlices {
		t.idx.addSlice(es)
	}
}

// indexGlobal (re)builds the parts of the index that the kinds translated
// as a whole (the global unit) decide: namespaces, ServiceEntry and
// ExternalName hosts, WorkloadEntry counts, GatewayClasses; waypoints and
// policiesByNs are emptied for translateWaypoints and indexPolicies to
// fill. It reads the Services already indexed (kubeHosts).
func (t *translator) indexGlobal() {
	x := &t.idx
	x.namespaces = make(map[string]*corev1.Namespace, len(t.objs.Namespaces))
	x.seHosts, x.seHostnames, x.aliasTargets = map[string]bool{}, map[string]bool{}, map[string]bool{}
	x.meshHosts = map[string]bool{}
	x.seSel = map[string][]*networkingv1.ServiceEntry{}
	x.waypoints, x.classes = map[string]*waypoint{}, map[string]*gatewayv1.GatewayClass{}
	x.policiesByNs, x.wePerNs = map[string][]selectorPolicy{}, map[string]int{}
	for _, ns := range t.objs.Namespaces {
		x.namespaces[ns.Name] = ns
	}
	for _, s := range t.objs.Services {
		if s.Spec.Type == corev1.ServiceTypeExternalName {
			x.seHosts[s.Namespace+"/"+t.serviceHostname(s)] = true
			x.aliasTargets[strings.TrimSuffix(strings.ToLower(s.Spec.ExternalName), ".")] = true
		}
	}
	for _, se := range t.objs.ServiceEntries {
		for _, h := range se.Spec.Hosts {
			x.meshHosts[h] = true
			x.seHosts[se.Namespace+"/"+h] = true
			x.seHostnames[h] = true
		}
		if se.Spec.WorkloadSelector != nil {
			x.seSel[se.Namespace] = append(x.seSel[se.Namespace], se)
		}
	}
	for _, we := range t.objs.WorkloadEntries {
		x.wePerNs[we.Namespace]++
	}
	for _, gc := range t.objs.GatewayClasses {
		x.classes[gc.Name] = gc
	}
}

// isMeshHost: h is the hostname of a Kubernetes Service or a ServiceEntry host.
func (x *index) isMeshHost(h string) bool { return x.kubeHosts[h] || x.meshHosts[h] }

// indexPolicies groups the selector policies by namespace; it runs after
// translateAuthorizationPolicies.
func (t *translator) indexPolicies() {
	if t.samePolicies != nil {
		t.idx.policiesByNs = t.samePolicies.idx.policiesByNs
		return
	}
	if o := t.prevPolicies; o != nil {
		// A namespace lists only its own policies: those of the
		// namespaces whose policies did not change are the same lists.
		m := maps.Clone(o.idx.policiesByNs)
		for ns := range t.policyNs {
			delete(m, ns)
		}
		for _, p := range t.selectorPolicies {
			if t.policyNs[p.namespace] {
				m[p.namespace] = append(m[p.namespace], p)
			}
		}
		t.idx.policiesByNs = m
		return
	}
	for _, p := range t.selectorPolicies {
		t.idx.policiesByNs[p.namespace] = append(t.idx.policiesByNs[p.namespace], p)
	}
}

// selectorKey is the smallest key of a selector (ok false: empty).
func selectorKey(sel map[string]string) (string, bool) {
	first := ""
	for k := range sel {
		if first == "" || k < first {
			first = k
		}
	}
	return first, first != ""
}

func (x *index) addService(s *corev1.Service, host string) {
	x.svcByName[s.Namespace+"/"+s.Name] = s
	x.svcHosts[s.Namespace+"/"+host] = true
	x.kubeHosts[host] = true
	if k, ok := selectorKey(s.Spec.Selector); ok {
		byKey := x.svcSel[s.Namespace]
		if byKey == nil {
			byKey = map[string]map[string]map[string]*corev1.Service{}
			x.svcSel[s.Namespace] = byKey
		}
		byVal := byKey[k]
		if byVal == nil {
			byVal = map[string]map[string]*corev1.Service{}
			byKey[k] = byVal
		}
		v := s.Spec.Selector[k]
		if byVal[v] == nil {
			byVal[v] = map[string]*corev1.Service{}
		}
		byVal[v][s.Name] = s
	}
}

func (x *index) removeService(s *corev1.Service, host string) {
	delete(x.svcByName, s.Namespace+"/"+s.Name)
	delete(x.svcHosts, s.Namespace+"/"+host)
	delete(x.kubeHosts, host)
	if k, ok := selectorKey(s.Spec.Selector); ok {
		delete(x.svcSel[s.Namespace][k][s.Spec.Selector[k]], s.Name)
	}
}

// servicesSelecting calls f for each Service in ns whose selector matches
// labels, in no particular order.
func (x *index) servicesSelecting(ns string, labels map[string]string, f func(*corev1.Service)) {
	byKey := x.svcSel[ns]
	if len(byKey) == 0 {
		return
	}
	for k, v := range labels {
		byVal := byKey[k]
		if byVal == nil {
			continue
		}
		for _, s := range byVal[v] {
			if selects(s.Spec.Selector, labels) {
				f(s)
			}
		}
	}
}

func (x *index) addPod(p *corev1.Pod) {
	x.pods[p.Namespace+"/"+p.Name] = p
	m := x.podsByNs[p.Namespace]
	if m == nil {
		m = map[string]*corev1.Pod{}
		x.podsByNs[p.Namespace] = m
	}
	m[p.Name] = p
	if n := p.Spec.NodeName; n != "" {
		if x.podsByNode[n] == nil {
			x.podsByNode[n] = map[string]*corev1.Pod{}
		}
		x.podsByNode[n][p.Namespace+"/"+p.Name] = p
	}
}

func (x *index) removePod(p *corev1.Pod) {
	delete(x.pods, p.Namespace+"/"+p.Name)
	delete(x.podsByNs[p.Namespace], p.Name)
	if m := x.podsByNode[p.Spec.NodeName]; m != nil {
		if delete(m, p.Namespace+"/"+p.Name); len(m) == 0 {
			delete(x.podsByNode, p.Spec.NodeName)
		}
	}
}

// slicePods returns the names of the pods a slice's endpoints name (looked
// up in the slice's namespace, whatever the reference's namespace says).
func slicePods(es *discoveryv1.EndpointSlice) []string {
	var out []string
	for _, e := range es.Endpoints {
		if r := e.TargetRef; r != nil && r.Kind == "Pod" {
			out = append(out, r.Name)
		}
	}
	return out
}

func (x *index) addSlice(es *discoveryv1.EndpointSlice) {
	key := es.Namespace + "/" + es.Name
	if name := es.Labels[LabelServiceName]; name != "" {
		k := es.Namespace + "/" + name
		if x.slicesBySvc[k] == nil {
			x.slicesBySvc[k] = map[string]*discoveryv1.EndpointSlice{}
		}
		x.slicesBySvc[k][key] = es
	}
	for _, p := range slicePods(es) {
		k := es.Namespace + "/" + p
		if x.podRefs[k] == nil {
			x.podRefs[k] = map[string]*discoveryv1.EndpointSlice{}
		}
		x.podRefs[k][key] = es
	}
}

func (x *index) removeSlice(es *discoveryv1.EndpointSlice) {
	key := es.Namespace + "/" + es.Name
	if name := es.Labels[LabelServiceName]; name != "" {
		delete(x.slicesBySvc[es.Namespace+"/"+name], key)
	}
	for _, p := range slicePods(es) {
		k := es.Namespace + "/" + p
		delete(x.podRefs[k], key)
		if len(x.podRefs[k]) == 0 {
			delete(x.podRefs, k)
		}
	}
}

// service returns the non-ExternalName Service ns/name, or nil.
func (t *translator) service(ns, name string) *corev1.Service {
	if ss := t.idx.svcSorted; ss != nil {
		i, found := slices.BinarySearchFunc(ss, [2]string{ns, name}, func(s *corev1.Service, k [2]string) int {
			return cmp.Or(cmp.Compare(s.Namespace, k[0]), cmp.Compare(s.Name, k[1]))
		})
		if !found || ss[i].Spec.Type == corev1.ServiceTypeExternalName {
			return nil
		}
		return ss[i]
	}
	return t.idx.svcByName[ns+"/"+name]
}

func (t *translator) serviceHostname(s *corev1.Service) string {
	return s.Name + "." + s.Namespace + ".svc." + t.cfg.DomainSuffix
}

func (t *translator) nsLabels(ns string) map[string]string {
	if n := t.idx.namespaces[ns]; n != nil {
		return n.Labels
	}
	return nil
}

func (t *translator) network(objLabels map[string]string, ns string) string {
	if n := objLabels[LabelNetwork]; n != "" {
		return n
	}
	if n := t.nsLabels(ns)[LabelNetwork]; n != "" {
		return n
	}
	return t.clusterNetwork()
}

// selects reports whether a non-empty selector matches labels. An empty or
// nil selector matches nothing (Kubernetes Services without selector).
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	return subset(selector, labels)
}

func subset(selector, labels map[string]string) bool {
	for k, v := range selector {
		if lv, ok := labels[k]; !ok || lv != v {
			return false
		}
	}
	return true
}

func addrBytes(a netip.Addr) []byte {
	if a.Is4In6() {
		a = a.Unmap()
	}
	return a.AsSlice()
}

func netAddr(network string, a netip.Addr) *workloadapi.NetworkAddress {
	return &workloadapi.NetworkAddress{Network: network, Address: addrBytes(a)}
}

// olderMeta orders objects oldest first (creationTimestamp, then ns/name),
// the tie-break Istio uses when several policies compete.
func olderMeta(a, b *metav1.ObjectMeta) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.Name < b.Name
}

// appProtocol maps a Kubernetes port to the wire AppProtocol as istiod
// does: explicit appProtocol first, then the port name prefix. Only the HTTP
// family is signalled; everything else is UNKNOWN.
func appProtocol(name string, appProto *string) workloadapi.AppProtocol {
	p := ""
	if appProto != nil {
		p = strings.ToLower(*appProto)
	}
	if p == "" {
		p = strings.ToLower(name)
		if i := strings.Index(p, "-"); i >= 0 {
			p = p[:i]
		}
	}
	return protocolFromString(p)
}

func protocolFromString(p string) workloadapi.AppProtocol {
	switch strings.ToLower(p) {
	case "http", "http1", "http/1.1":
		return workloadapi.AppProtocol_HTTP11
	case "http2", "h2c", "kubernetes.io/h2c":
		return workloadapi.AppProtocol_HTTP2
	case "grpc", "grpc-web":
		return workloadapi.AppProtocol_GRPC
	case "tcp":
		// istiod's toAppProtocolFromProtocol: TCP is TCP, and HTTPS is
		// TLS to ztunnel (it carries no HTTP a proxy can read).
		return workloadapi.AppProtocol_TCP
	case "https", "tls", "kubernetes.io/wss":
		return workloadapi.AppProtocol_TLS
	case "kubernetes.io/ws":
		return workloadapi.AppProtocol_HTTP11
	}
	return workloadapi.AppProtocol_UNKNOWN
}

// resolveTargetPort returns the pod port a Service port reaches: a numeric
// targetPort as is, an unset one as the service port (the API server's
// default, which local-mode YAML does not get), a named one looked up in the
// pod's container ports. ok is false when a named port is not found.
func resolveTargetPort(sp corev1.ServicePort, pod *corev1.Pod) (uint32, bool) {
	switch {
	case sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal != "":
		if pod == nil {
			return 0, false
		}
		for _, c := range pod.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == sp.TargetPort.StrVal && (cp.Protocol == "" || cp.Protocol == sp.Protocol || sp.Protocol == "") {
					return uint32(cp.ContainerPort), true
				}
			}
		}
		return 0, false
	case sp.TargetPort.Type == intstr.Int && sp.TargetPort.IntVal != 0:
		return uint32(sp.TargetPort.IntVal), true
	default:
		return uint32(sp.Port), true
	}
}

// tcpPorts returns the service's TCP ports: node proxies carry TCP only.
func tcpPorts(s *corev1.Service) []corev1.ServicePort {
	var out []corev1.ServicePort
	for _, p := range s.Spec.Ports {
		if p.Protocol == "" || p.Protocol == corev1.ProtocolTCP {
			out = append(out, p)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
