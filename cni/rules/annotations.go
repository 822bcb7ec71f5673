package rules

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Pod annotations read by ParseAnnotations.
const (
	AnnotationBypassInboundCapture    = "ambient.istio.io/bypass-inbound-capture"
	AnnotationDNSCapture              = "ambient.istio.io/dns-capture"
	AnnotationRerouteVirtualIfaces    = "istio.io/reroute-virtual-interfaces"
	AnnotationExcludeOutboundPorts    = "traffic.sidecar.istio.io/excludeOutboundPorts"
	AnnotationExcludeOutboundIPRanges = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
	AnnotationExcludeInboundPorts     = "traffic.sidecar.istio.io/excludeInboundPorts"
)

// AnnotationError reports one annotation with a value we cannot use.
type AnnotationError struct {
	Annotation string
	Value      string
	Err        error
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("rules: annotation %s=%q: %v", e.Annotation, e.Value, e.Err)
}

func (e *AnnotationError) Unwrap() error { return e.Err }

// ParseAnnotations returns defaults with the pod's annotations applied.
// defaults carries the agent-wide settings (IPv6, DNSCapture); an annotation
// replaces the one setting it names. Every bad annotation is reported, each as an
// *AnnotationError (joined with errors.Join); on error the returned settings
// are the defaults.
//
// Formats (whitespace around items is ignored, an empty value means "none"):
//   - booleans ("ambient.istio.io/bypass-inbound-capture",
//     "ambient.istio.io/dns-capture"): "true" or "false" (strconv.ParseBool
//     spellings).
//   - ports: comma-separated decimal ports 1-65535, e.g. "80,443". No ranges,
//     no "*".
//   - IP ranges: comma-separated CIDRs or bare IPs (a host), IPv4 or IPv6,
//     e.g. "10.0.0.0/8,fd00::/8,192.168.1.7". "*" is rejected: this
//     annotation excludes destinations, and excluding everything is written
//     "0.0.0.0/0,::/0" (or the pod is left out of the mesh). IPv4-mapped IPv6
//     ranges are rejected: write the IPv4 form.
//   - interfaces: comma-separated interface names.
func ParseAnnotations(annotations map[string]string, defaults PodSettings) (PodSettings, error) {
	s := defaults
	var errs []error
	fail := func(name, value string, err error) {
		errs = append(errs, &AnnotationError{Annotation: name, Value: value, Err: err})
	}
	for _, b := range []struct {
		name string
		dst  *bool
	}{
		{AnnotationBypassInboundCapture, &s.BypassInboundCapture},
		{AnnotationDNSCapture, &s.DNSCapture},
	} {
		v, ok := annotations[b.name]
		if !ok {
			continue
		}
		parsed, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			fail(b.name, v, errors.New(`want "true" or "false"`))
			continue
		}
		*b.dst = parsed
	}
	if v, ok := annotations[AnnotationRerouteVirtualIfaces]; ok {
		ifaces := splitList(v)
		for _, item := range ifaces {
			if err := validInterfaceName(item); err != nil {
				fail(AnnotationRerouteVirtualIfaces, v, err)
				break
			}
		}
		s.RerouteVirtualInterfaces = ifaces
	}
	for _, p := range []struct {
		name string
		dst  *[]uint16
	}{
		{AnnotationExcludeOutboundPorts, &s.ExcludeOutboundPorts},
		{AnnotationExcludeInboundPorts, &s.ExcludeInboundPorts},
	} {
		v, ok := annotations[p.name]
		if !ok {
			continue
		}
		ports, err := parsePorts(v)
		if err != nil {
			fail(p.name, v, err)
			continue
		}
		*p.dst = ports
	}
	if v, ok := annotations[AnnotationExcludeOutboundIPRanges]; ok {
		ranges, err := parseRanges(v)
		if err != nil {
			fail(AnnotationExcludeOutboundIPRanges, v, err)
		} else {
			s.ExcludeOutboundIPRanges = ranges
		}
	}
	if err := errors.Join(errs...); err != nil {
		return defaults, err
	}
	return s, nil
}

// splitList splits a comma-separated list, trimming items. "" gives nil; an
// empty item ("80,,443") is kept as "" for the caller to reject.
func splitList(v string) []string {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	items := strings.Split(v, ",")
	for i := range items {
		items[i] = strings.TrimSpace(items[i])
	}
	return items
}

func parsePorts(v string) ([]uint16, error) {
	var out []uint16
	for _, item := range splitList(v) {
		n, err := strconv.ParseUint(item, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("invalid port %q: want a number 1-65535", item)
		}
		out = append(out, uint16(n))
	}
	return out, nil
}

func parseRanges(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, item := range splitList(v) {
		if item == "*" {
			return nil, errors.New(`"*" is not supported; write "0.0.0.0/0,::/0" to exclude everything`)
		}
		p, err := parseRange(item)
		if err != nil {
			return nil, fmt.Errorf("invalid IP range %q: %w", item, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// parseRange parses a CIDR or a bare IP (a host range).
func parseRange(item string) (netip.Prefix, error) {
	if !strings.Contains(item, "/") {
		a, err := netip.ParseAddr(item)
		switch {
		case err != nil:
			return netip.Prefix{}, errors.New("want a CIDR or an IP")
		case a.Zone() != "":
			return netip.Prefix{}, errors.New("zones are not allowed")
		}
		item = netip.PrefixFrom(a, a.BitLen()).String()
	}
	p, err := netip.ParsePrefix(item)
	switch {
	case err != nil:
		return netip.Prefix{}, errors.New("want a CIDR or an IP")
	case p.Addr().Is4In6():
		return netip.Prefix{}, errors.New("IPv4-mapped IPv6; write the IPv4 form")
	}
	return p, nil
}
