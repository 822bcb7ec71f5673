package translate

import (
	"net/netip"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// translateWaypoints indexes Gateways of class istio-waypoint that have an
// address. The GatewayAddress uses the IP form whenever the Gateway has an
// IP (local mode has no DNS for waypoint hostnames, and an IP needs no
// lookup at the node proxy); only a Gateway with nothing but a Hostname
// address gets the hostname form (namespace + hostname).
func (t *translator) translateWaypoints() {
	for _, gw := range t.objs.Gateways {
		if string(gw.Spec.GatewayClassName) != WaypointClass {
			continue
		}
		key := gw.Namespace + "/" + gw.Name
		tt := t.waypointFor(gw)
		w := &waypoint{key: key, trafficType: tt}
		switch tt {
		case "service":
			w.forService = true
		case "workload":
			w.forWorkload = true
		case "all":
			w.forService, w.forWorkload = true, true
		case "none":
		default:
			t.warnf("Gateway", gw.Namespace, gw.Name, "unknown %s value %q; treating it as \"service\"", LabelWaypointFor, tt)
			w.forService, w.trafficType = true, "service"
		}
		w.addr = t.waypointAddress(gw)
		w.binding = t.inboundBinding(gw)
		w.allowed = t.allowedNamespaces(gw, w.binding)
		if w.addr == nil {
			t.warnf("Gateway", gw.Namespace, gw.Name, "waypoint has no address yet (status.addresses, spec.addresses or annotation %s); objects bound to it get no waypoint", AnnotationWaypointAddress)
			continue
		}
		t.idx.waypoints[key] = w
	}
}

// AnnotationWaypointInboundBinding (istio/api, on a waypoint Gateway or
// its GatewayClass; the Gateway's wins) says how the waypoint's pods take
// traffic from their node proxy: "<PROTOCOL>" or "<PROTOCOL>/<port>",
// PROTOCOL NONE or PROXY. It becomes the pods' application_tunnel (a
// "sandwiched" waypoint: PROXY v2 with the client's identity, on that port).
const AnnotationWaypointInboundBinding = "ambient.istio.io/waypoint-inbound-binding"

// inboundBinding parses the Gateway's (else its class's) inbound binding.
// An invalid value is warned about and ignored, as istiod does: the
// waypoint then takes plain HBONE, which it must terminate itself.
func (t *translator) inboundBinding(gw *gatewayv1.Gateway) *workloadapi.ApplicationTunnel {
	v, ok := gw.Annotations[AnnotationWaypointInboundBinding]
	if !ok {
		gc := t.idx.classes[string(gw.Spec.GatewayClassName)]
		if gc == nil {
			return nil
		}
		if v, ok = gc.Annotations[AnnotationWaypointInboundBinding]; !ok {
			return nil
		}
	}
	protocol, portText, hasPort := strings.Cut(v, "/")
	at := &workloadapi.ApplicationTunnel{}
	switch protocol {
	case "NONE":
		at.Protocol = workloadapi.ApplicationTunnel_NONE
	case "PROXY":
		at.Protocol = workloadapi.ApplicationTunnel_PROXY
	default:
		t.warnf("Gateway", gw.Namespace, gw.Name, "%s %q: protocol must be NONE or PROXY; ignored", AnnotationWaypointInboundBinding, v)
		return nil
	}
	if hasPort {
		port, err := strconv.ParseUint(portText, 10, 16)
		if err != nil || port == 0 {
			t.warnf("Gateway", gw.Namespace, gw.Name, "%s %q: port must be 1-65535; ignored", AnnotationWaypointInboundBinding, v)
			return nil
		}
		at.Port = uint32(port)
	}
	return at
}

func (t *translator) waypointFor(gw *gatewayv1.Gateway) string {
	if v, ok := gw.Labels[LabelWaypointFor]; ok {
		return v
	}
	if gc := t.idx.classes[string(gw.Spec.GatewayClassName)]; gc != nil {
		if v, ok := gc.Labels[LabelWaypointFor]; ok {
			return v
		}
	}
	return "service"
}

func (t *translator) waypointAddress(gw *gatewayv1.Gateway) *workloadapi.GatewayAddress {
	network := t.network(gw.Labels, gw.Namespace)
	var hostname string
	ipOf := func(typ *gatewayv1.AddressType, value string) (netip.Addr, bool) {
		if typ != nil && *typ == gatewayv1.HostnameAddressType {
			if hostname == "" {
				hostname = value
			}
			return netip.Addr{}, false
		}
		if typ != nil && *typ != gatewayv1.IPAddressType {
			return netip.Addr{}, false
		}
		ip, err := netip.ParseAddr(value)
		return ip, err == nil
	}
	var ip netip.Addr
	for _, a := range gw.Status.Addresses {
		if v, ok := ipOf(a.Type, a.Value); ok && !ip.IsValid() {
			ip = v
		}
	}
	if !ip.IsValid() {
		for _, a := range gw.Spec.Addresses {
			if v, ok := ipOf(a.Type, a.Value); ok && !ip.IsValid() {
				ip = v
			}
		}
	}
	if !ip.IsValid() {
		for _, s := range strings.Split(gw.Annotations[AnnotationWaypointAddress], ",") {
			if v, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
				ip = v
				break
			}
		}
	}
	switch {
	case ip.IsValid():
		return &workloadapi.GatewayAddress{
			Destination:   &workloadapi.GatewayAddress_Address{Address: netAddr(network, ip)},
			HboneMtlsPort: HBONEPort,
		}
	case hostname != "":
		return &workloadapi.GatewayAddress{
			Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{
				Namespace: gw.Namespace, Hostname: hostname,
			}},
			HboneMtlsPort: HBONEPort,
		}
	}
	return nil
}

// boundWaypoint resolves istio.io/use-waypoint for an object: its own label
// wins over its namespace's; "none" opts out. wantWorkload selects which
// traffic type the waypoint must accept (workload vs service). Objects bound
// to a waypoint of the other traffic type simply get none.
func (t *translator) boundWaypoint(kind, ns, name string, labels map[string]string, wantWorkload bool) *workloadapi.GatewayAddress {
	src, srcKind, srcName := labels, kind, name
	srcNs := ns
	if _, ok := labels[LabelUseWaypoint]; !ok {
		src, srcKind, srcName, srcNs = t.nsLabels(ns), "Namespace", ns, ""
	}
	wpName := src[LabelUseWaypoint]
	if wpName == "" || wpName == "none" {
		return nil
	}
	wpNs := src[LabelUseWaypointNamespace]
	if wpNs == "" {
		wpNs = ns
	}
	w := t.idx.waypoints[wpNs+"/"+wpName]
	if w == nil {
		t.warnf(srcKind, srcNs, srcName, "%s refers to waypoint %s/%s, which does not exist or has no address", LabelUseWaypoint, wpNs, wpName)
		return nil
	}
	if !t.mayUseWaypoint(w, ns) {
		t.warnf(srcKind, srcNs, srcName, "%s: waypoint %s refuses %s %s/%s: %s; it gets no waypoint", LabelUseWaypoint, w.key, kind, ns, name, w.allowed.refusal(ns))
		return nil
	}
	if wantWorkload && !w.forWorkload || !wantWorkload && !w.forService {
		if srcKind != "Namespace" {
			t.warnf(srcKind, srcNs, srcName, "waypoint %s is for %q traffic; this %s's traffic does not use it", w.key, w.trafficType, map[bool]string{true: "workload", false: "service"}[wantWorkload])
		}
		return nil
	}
	return w.addr
}

// Weighted waypoint canary (Istio 1.31, istio/api well-known names): a
// Service, ServiceEntry or Namespace names a second waypoint beside
// istio.io/use-waypoint and the share (0-100) of new connections it gets.
const (
	LabelUseWaypointCanary            = "istio.io/use-waypoint-canary"
	LabelUseWaypointCanaryNamespace   = "istio.io/use-waypoint-canary-namespace"
	AnnotationUseWaypointCanaryWeight = "istio.io/use-waypoint-canary-weight"
)

// weightedWaypoints resolves the canary labels for an object whose primary
// service waypoint is primary: the object's own canary label wins over its
// namespace's, and the weight annotation is read from the same object. The
// set is [{primary, 100-w}, {canary, w}], istiod's shape; primary stays in
// Service.waypoint for node proxies without the field. A weight of 0 keeps
// the canary listed (it gets no traffic). Anything that cannot be honoured
// (no primary, an unknown or non-service canary, a weight that is not an
// integer 0-100) is warned about and yields no set: the service stays on
// its primary waypoint, as istiod does with invalid values.
func (t *translator) weightedWaypoints(kind, ns, name string, labels, annotations map[string]string, primary *workloadapi.GatewayAddress) []*workloadapi.WeightedWaypoint {
	src, ann, srcKind, srcName, srcNs := labels, annotations, kind, name, ns
	if _, ok := labels[LabelUseWaypointCanary]; !ok {
		src, ann, srcKind, srcName, srcNs = t.nsLabels(ns), nil, "Namespace", ns, ""
		if n := t.idx.namespaces[ns]; n != nil {
			ann = n.Annotations
		}
	}
	canaryName := src[LabelUseWaypointCanary]
	if canaryName == "" || canaryName == "none" {
		return nil
	}
	if primary == nil {
		t.warnf(srcKind, srcNs, srcName, "%s without a usable %s; the canary is ignored", LabelUseWaypointCanary, LabelUseWaypoint)
		return nil
	}
	canaryNs := src[LabelUseWaypointCanaryNamespace]
	if canaryNs == "" {
		canaryNs = ns
	}
	w := t.idx.waypoints[canaryNs+"/"+canaryName]
	switch {
	case w == nil:
		t.warnf(srcKind, srcNs, srcName, "%s refers to waypoint %s/%s, which does not exist or has no address; all traffic stays on the primary", LabelUseWaypointCanary, canaryNs, canaryName)
		return nil
	case !w.forService:
		t.warnf(srcKind, srcNs, srcName, "canary waypoint %s is for %q traffic, not service traffic; all traffic stays on the primary", w.key, w.trafficType)
		return nil
	case !t.mayUseWaypoint(w, ns):
		t.warnf(srcKind, srcNs, srcName, "canary waypoint %s refuses %s %s/%s: %s; all traffic stays on the primary", w.key, kind, ns, name, w.allowed.refusal(ns))
		return nil
	}
	raw, ok := ann[AnnotationUseWaypointCanaryWeight]
	weight := 0
	if ok {
		v, err := strconv.Atoi(strings.TrimSpace(raw))
		if err != nil || v < 0 || v > 100 {
			t.warnf(srcKind, srcNs, srcName, "%s %q is not an integer 0-100; all traffic stays on the primary", AnnotationUseWaypointCanaryWeight, raw)
			return nil
		}
		weight = v
	}
	return []*workloadapi.WeightedWaypoint{
		{Destination: primary, Weight: uint32(100 - weight)},
		{Destination: w.addr, Weight: uint32(weight)},
	}
}

// waypointOf reports whether the service's traffic may be sent to the
// waypoint address addr: it is the primary or in the weighted set.
func waypointOf(s *workloadapi.Service, addr *workloadapi.GatewayAddress) bool {
	if proto.Equal(s.GetWaypoint(), addr) {
		return true
	}
	for _, ww := range s.GetWeightedWaypoints() {
		if proto.Equal(ww.GetDestination(), addr) {
			return true
		}
	}
	return false
}

// allowedNamespaces is which namespaces' Services, ServiceEntries and
// workloads may use a waypoint, as istiod decides it: the allowedRoutes
// .namespaces of the waypoint's listener (the one its inbound binding
// names, else the HBONE listener on 15008); Same when there is no such
// listener or it says nothing. A Service in another namespace that names
// the waypoint (istio.io/use-waypoint-namespace) is refused, not bound:
// otherwise any tenant could push its traffic through, or have its
// traffic handled by, a waypoint it does not own without the owner's
// consent.
type allowedNamespaces struct {
	own  string // the waypoint's namespace
	from gatewayv1.FromNamespaces
	// selector of From=Selector; nil when it does not parse (matches
	// nothing: fail closed).
	selector labels.Selector
	bad      string // why the selector did not parse
}

func (t *translator) allowedNamespaces(gw *gatewayv1.Gateway, binding *workloadapi.ApplicationTunnel) allowedNamespaces {
	a := allowedNamespaces{own: gw.Namespace, from: gatewayv1.NamespacesFromSame}
	var l *gatewayv1.Listener
	for i := range gw.Spec.Listeners {
		li := &gw.Spec.Listeners[i]
		if binding != nil && (binding.Port != 0 && uint32(li.Port) == binding.Port ||
			binding.Port == 0 && binding.Protocol == workloadapi.ApplicationTunnel_PROXY && li.Protocol == "istio.io/PROXY") {
			l = li
			break
		}
	}
	if l == nil {
		for i := range gw.Spec.Listeners {
			if li := &gw.Spec.Listeners[i]; li.Protocol == "HBONE" && li.Port == HBONEPort {
				l = li
				break
			}
		}
	}
	if l == nil || l.AllowedRoutes == nil || l.AllowedRoutes.Namespaces == nil {
		return a
	}
	if f := l.AllowedRoutes.Namespaces.From; f != nil {
		a.from = *f
	}
	if a.from == gatewayv1.NamespacesFromSelector {
		sel, err := metav1.LabelSelectorAsSelector(l.AllowedRoutes.Namespaces.Selector)
		switch {
		case err != nil:
			a.bad = err.Error()
			t.warnf("Gateway", gw.Namespace, gw.Name, "listener %s allowedRoutes.namespaces.selector: %v; no other namespace may use this waypoint", l.Name, err)
		case l.AllowedRoutes.Namespaces.Selector == nil:
			a.bad = "from Selector without a selector"
			t.warnf("Gateway", gw.Namespace, gw.Name, "listener %s allowedRoutes.namespaces: from Selector without a selector; no other namespace may use this waypoint", l.Name)
		default:
			a.selector = sel
		}
	}
	return a
}

// mayUseWaypoint: objects of namespace ns may use w.
func (t *translator) mayUseWaypoint(w *waypoint, ns string) bool {
	a := w.allowed
	switch {
	case a.from == gatewayv1.NamespacesFromSame || a.from == "":
		return ns == a.own
	case a.from == gatewayv1.NamespacesFromAll:
		return true
	case a.from == gatewayv1.NamespacesFromSelector:
		// As istiod: the selector decides for the waypoint's own
		// namespace too.
		n := t.idx.namespaces[ns]
		return a.selector != nil && n != nil && a.selector.Matches(labels.Set(n.Labels))
	}
	// An unknown From: istiod falls back to Same.
	return ns == a.own
}

func (a allowedNamespaces) refusal(ns string) string {
	switch {
	case a.from == gatewayv1.NamespacesFromSelector && a.selector == nil:
		return "its listener's allowedRoutes.namespaces selector is invalid (" + a.bad + ")"
	case a.from == gatewayv1.NamespacesFromSelector:
		return "namespace " + ns + " does not match its listener's allowedRoutes.namespaces selector " + a.selector.String()
	}
	from := string(a.from)
	if a.from == gatewayv1.NamespacesFromSame || a.from == "" {
		from = "Same (the default)"
	}
	return "its listener's allowedRoutes.namespaces.from is " + from + ", so only namespace " + a.own + " may use it"
}
