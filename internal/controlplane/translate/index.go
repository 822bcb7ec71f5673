package translate

import (
	"net/netip"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
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
	LabelTunnel               = "networking.istio.io/tunnel"
	LabelNetwork              = "topology.istio.io/network"
	LabelSubzone              = "topology.istio.io/subzone"
	LabelRegion               = "topology.kubernetes.io/region"
	LabelZone                 = "topology.kubernetes.io/zone"
	LabelServiceName          = "kubernetes.io/service-name"
	LabelPodTemplateHash      = "pod-template-hash"
	AnnotationTrafficDist     = "networking.istio.io/traffic-distribution"

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
}

type index struct {
	namespaces map[string]*corev1.Namespace
	// services by ns/name (non-ExternalName), for selector matching.
	services []*corev1.Service
	// meshHosts are hostnames of mesh services (k8s FQDNs and SE hosts).
	meshHosts map[string]bool
	waypoints map[string]*waypoint // by ns/name, only usable ones (with address)
	classes   map[string]*gatewayv1.GatewayClass
	pods      map[string]*corev1.Pod // ns/name
}

func (t *translator) buildIndex() {
	t.idx = index{
		namespaces: map[string]*corev1.Namespace{},
		meshHosts:  map[string]bool{},
		waypoints:  map[string]*waypoint{},
		classes:    map[string]*gatewayv1.GatewayClass{},
		pods:       map[string]*corev1.Pod{},
	}
	for _, ns := range t.objs.Namespaces {
		t.idx.namespaces[ns.Name] = ns
	}
	for _, s := range t.objs.Services {
		if s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		t.idx.services = append(t.idx.services, s)
		t.idx.meshHosts[t.serviceHostname(s)] = true
	}
	for _, se := range t.objs.ServiceEntries {
		for _, h := range se.Spec.Hosts {
			t.idx.meshHosts[h] = true
		}
	}
	for _, gc := range t.objs.GatewayClasses {
		t.idx.classes[gc.Name] = gc
	}
	for _, p := range t.objs.Pods {
		t.idx.pods[p.Namespace+"/"+p.Name] = p
	}
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
	return t.cfg.Network
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
