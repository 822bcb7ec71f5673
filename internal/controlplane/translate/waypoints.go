package translate

import (
	"net/netip"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
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
