package translate

import (
	"net/netip"
	"strings"

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
		if w.addr == nil {
			t.warnf("Gateway", gw.Namespace, gw.Name, "waypoint has no address yet (status.addresses, spec.addresses or annotation %s); objects bound to it get no waypoint", AnnotationWaypointAddress)
			continue
		}
		t.idx.waypoints[key] = w
	}
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
