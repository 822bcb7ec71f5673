package translate

import (
	"fmt"
	"net/netip"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// The Validate functions below list what the control plane refuses in one
// object without looking at the rest of the cluster, each "field: why" as
// the object's status names it. The validating webhook refuses exactly
// these, so an object it admits is never one whose status would call these
// fields refused; what needs the cluster (an address another namespace
// owns, a missing backend, a ReferenceGrant) is decided by the control
// plane alone, which stays the last line when the webhook is down.

// ValidateServiceEntry lists the addresses no namespace may claim or that
// are no address at all, and exportTo values that are invalid.
func ValidateServiceEntry(se *networkingv1.ServiceEntry) []string {
	var out []string
	for i, a := range se.Spec.GetAddresses() {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				out = append(out, fmt.Sprintf("spec.addresses[%d]: %q is not an IP or CIDR", i, a))
				continue
			}
			p = netip.PrefixFrom(ip, ip.BitLen())
		}
		if p.Bits() == 0 {
			out = append(out, fmt.Sprintf("spec.addresses[%d]: %s covers every address, including pods, nodes and other namespaces' Services", i, a))
		}
	}
	_, bad := parseExportTo(se.Spec.GetExportTo(), nil, se.Namespace, "spec.exportTo")
	return append(out, bad...)
}

// ValidateVirtualService lists invalid exportTo values.
func ValidateVirtualService(v *networkingv1.VirtualService) []string {
	_, bad := parseExportTo(v.Spec.GetExportTo(), nil, v.Namespace, "spec.exportTo")
	return bad
}

// ValidateDestinationRule lists every traffic policy field the waypoint
// cannot enforce and invalid exportTo values (validateDR).
func ValidateDestinationRule(d *networkingv1.DestinationRule) []string { return validateDR(d) }

// ValidateHTTPRoute lists what its rules ask that the waypoint cannot do.
func ValidateHTTPRoute(r *gatewayv1.HTTPRoute) []string {
	var out []string
	for i, rule := range r.Spec.Rules {
		out = append(out, unsupportedHTTPRule(i, rule)...)
	}
	return out
}

// ValidateGRPCRoute is ValidateHTTPRoute for a GRPCRoute.
func ValidateGRPCRoute(r *gatewayv1.GRPCRoute) []string {
	var out []string
	for i, rule := range r.Spec.Rules {
		out = append(out, unsupportedGRPCRule(i, rule)...)
	}
	return out
}
