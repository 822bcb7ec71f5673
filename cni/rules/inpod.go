package rules

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// PodSettings are the per-pod inputs of the in-pod rule set. The zero value is
// an IPv4-only pod without DNS capture and without exclusions.
type PodSettings struct {
	// IPv6 also programs ip6tables and the IPv6 local route (the agent's
	// global IPv6 setting).
	IPv6 bool
	// DNSCapture redirects the pod's DNS (UDP and TCP port 53) to ztunnel's
	// DNS proxy on 15053 (agent default, overridden by
	// ambient.istio.io/dns-capture). It is off in effect when port 53 is in
	// ExcludeOutboundPorts.
	DNSCapture bool
	// BypassInboundCapture is "ingress mode"
	// (ambient.istio.io/bypass-inbound-capture): no inbound 15006 redirect,
	// no probe ACCEPT.
	BypassInboundCapture bool
	// RerouteVirtualInterfaces: TCP arriving on these interfaces is sent to
	// 15001 as outbound traffic (istio.io/reroute-virtual-interfaces).
	RerouteVirtualInterfaces []string
	// ExcludeOutboundPorts: outbound TCP to these ports is not captured
	// (traffic.sidecar.istio.io/excludeOutboundPorts). Our extension: Istio
	// ignores this annotation for ambient pods.
	ExcludeOutboundPorts []uint16
	// ExcludeOutboundIPRanges: outbound traffic to these ranges is not
	// captured, DNS included, and is kept out of the DNS conntrack zone
	// (traffic.sidecar.istio.io/excludeOutboundIPRanges). IPv6 ranges only
	// take effect when IPv6 is set. Our extension, as above.
	ExcludeOutboundIPRanges []netip.Prefix
	// ExcludeInboundPorts: inbound TCP to these ports is not redirected to
	// 15006 (traffic.sidecar.istio.io/excludeInboundPorts). Our extension.
	ExcludeInboundPorts []uint16
}

// ErrInvalidSettings is wrapped by InPod and Validate errors.
var ErrInvalidSettings = errors.New("invalid pod settings")

// Validate reports settings that cannot be turned into rules.
func (s PodSettings) Validate() error {
	var errs []error
	for _, name := range s.RerouteVirtualInterfaces {
		if err := validInterfaceName(name); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range append(slices.Clone(s.ExcludeOutboundPorts), s.ExcludeInboundPorts...) {
		if p == 0 {
			errs = append(errs, errors.New("port 0"))
		}
	}
	for _, p := range s.ExcludeOutboundIPRanges {
		if !p.IsValid() {
			errs = append(errs, fmt.Errorf("invalid IP range %v", p))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("rules: %w: %w", ErrInvalidSettings, err)
	}
	return nil
}

func validInterfaceName(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." ||
		strings.ContainsAny(name, "/: \t\n") {
		return fmt.Errorf("invalid interface name %q", name)
	}
	return nil
}

// InPod returns the capture rules for a pod's network namespace: the rules
// of reference §3.5, plus our exclusion rules. Ports and ranges are
// deduplicated and sorted, and ranges masked, so equal settings give equal
// rule sets.
//
// Exclusions are RETURNs placed before every redirect that could catch the
// traffic: excluded outbound ranges and ports before the DNS (15053) and
// outbound (15001) redirects and before the virtual-interface redirects,
// excluded inbound ports before the 15006 redirect. Excluded ranges are also
// RETURNed in the raw table before the DNS conntrack-zone rules. Excluding
// port 53 turns DNS capture off for the pod.
func InPod(s PodSettings) (RuleSet, error) {
	if err := s.Validate(); err != nil {
		return RuleSet{}, err
	}
	outPorts := sortedPorts(s.ExcludeOutboundPorts)
	inPorts := sortedPorts(s.ExcludeInboundPorts)
	dns := s.DNSCapture && !slices.Contains(outPorts, 53)

	var rs RuleSet
	fams := []Family{IPv4}
	if s.IPv6 {
		fams = append(fams, IPv6)
	}
	for _, f := range fams {
		for _, t := range tableOrder() {
			rs.Owned = append(rs.Owned, ChainRef{f, t, ChainPrerouting}, ChainRef{f, t, ChainOutput})
		}
		addFamily(&rs, f, s, outPorts, inPorts, sortedRanges(s.ExcludeOutboundIPRanges, f), dns)
	}
	rs.IPRules = append(rs.IPRules, IPRule{IPv4, ConnMark, MarkMask, RulePriority, RouteTable})
	rs.Routes = append(rs.Routes, LocalRoute{netip.MustParsePrefix("0.0.0.0/0"), "lo", RouteTable})
	if s.IPv6 {
		rs.IPRules = append(rs.IPRules, IPRule{IPv6, ConnMark, MarkMask, RulePriority, RouteTable})
		rs.Routes = append(rs.Routes, LocalRoute{netip.MustParsePrefix("::/0"), "lo", RouteTable})
	}
	return rs, nil
}

func addFamily(rs *RuleSet, f Family, s PodSettings, outPorts, inPorts []uint16, ranges []netip.Prefix, dns bool) {
	loopback, probe := "127.0.0.1/32", ProbeSNATv4+"/32"
	if f == IPv6 {
		loopback, probe = "::1/128", ProbeSNATv6+"/128"
	}
	mark := fmt.Sprintf("%#x/%#x", ZtunnelMark, MarkMask)
	connmark := fmt.Sprintf("%#x/%#x", ConnMark, MarkMask)
	add := func(table, chain string, args ...string) {
		rs.Rules = append(rs.Rules, Rule{Family: f, Table: table, Chain: chain, Args: args})
	}
	// outboundExclusions RETURNs excluded destinations, only for traffic
	// arriving on iface if set. Arguments are in canonical order (-d before
	// -i before -p).
	outboundExclusions := func(chain, iface string) {
		var in []string
		if iface != "" {
			in = []string{"-i", iface}
		}
		for _, r := range ranges {
			add("nat", chain, slices.Concat([]string{"-d", r.String()}, in, []string{"-j", "RETURN"})...)
		}
		for _, p := range outPorts {
			add("nat", chain, slices.Concat(in, []string{"-p", "tcp", "-m", "tcp", "--dport", port(p), "-j", "RETURN"})...)
		}
	}

	// mangle: mark connections ztunnel made to the app, restore the mark on
	// the app's replies so they are policy-routed back to ztunnel.
	add("mangle", "PREROUTING", "-j", ChainPrerouting)
	add("mangle", "OUTPUT", "-j", ChainOutput)
	add("mangle", ChainPrerouting, "-m", "mark", "--mark", mark, "-j", "CONNMARK", "--set-xmark", connmark)
	add("mangle", ChainOutput, "-m", "connmark", "--mark", connmark,
		"-j", "CONNMARK", "--restore-mark", "--nfmask", "0xffffffff", "--ctmask", "0xffffffff")

	// nat
	add("nat", "PREROUTING", "-j", ChainPrerouting)
	add("nat", "OUTPUT", "-j", ChainOutput)
	for _, iface := range s.RerouteVirtualInterfaces {
		outboundExclusions(ChainPrerouting, iface)
		add("nat", ChainPrerouting, "-i", iface, "-p", "tcp", "-j", "REDIRECT", "--to-ports", port(PortOutbound))
		add("nat", ChainPrerouting, "-i", iface, "-p", "tcp", "-j", "RETURN")
	}
	if !s.BypassInboundCapture {
		add("nat", ChainPrerouting, "-s", probe, "-p", "tcp", "-m", "tcp", "-j", "ACCEPT")
		for _, p := range inPorts {
			add("nat", ChainPrerouting, "-p", "tcp", "-m", "tcp", "--dport", port(p), "-j", "RETURN")
		}
		add("nat", ChainPrerouting, "!", "-d", loopback, "-p", "tcp", "-m", "tcp", "!", "--dport", port(PortHBONE),
			"-m", "mark", "!", "--mark", mark, "-j", "REDIRECT", "--to-ports", port(PortInbound))
	}
	add("nat", ChainOutput, "-d", probe, "-p", "tcp", "-m", "tcp", "-j", "ACCEPT")
	outboundExclusions(ChainOutput, "")
	if dns {
		add("nat", ChainOutput, "!", "-o", "lo", "-p", "udp", "-m", "mark", "!", "--mark", mark,
			"-m", "udp", "--dport", "53", "-j", "REDIRECT", "--to-ports", port(PortDNS))
		add("nat", ChainOutput, "!", "-d", loopback, "-p", "tcp", "-m", "tcp", "--dport", "53",
			"-m", "mark", "!", "--mark", mark, "-j", "REDIRECT", "--to-ports", port(PortDNS))
	}
	add("nat", ChainOutput, "-p", "tcp", "-m", "mark", "--mark", connmark, "-j", "ACCEPT")
	add("nat", ChainOutput, "!", "-d", loopback, "-o", "lo", "-j", "ACCEPT")
	add("nat", ChainOutput, "!", "-d", loopback, "-p", "tcp", "-m", "mark", "!", "--mark", mark,
		"-j", "REDIRECT", "--to-ports", port(PortOutbound))

	// raw: ztunnel's own DNS queries and their answers live in conntrack
	// zone 1, apart from the app's redirected queries; excluded servers
	// stay out of it.
	if !dns {
		return
	}
	add("raw", "PREROUTING", "-j", ChainPrerouting)
	add("raw", "OUTPUT", "-j", ChainOutput)
	for _, r := range ranges {
		add("raw", ChainOutput, "-d", r.String(), "-j", "RETURN")
	}
	add("raw", ChainOutput, "-p", "udp", "-m", "mark", "--mark", mark, "-m", "udp", "--dport", "53", "-j", "CT", "--zone", "1")
	for _, r := range ranges {
		add("raw", ChainPrerouting, "-s", r.String(), "-j", "RETURN")
	}
	add("raw", ChainPrerouting, "-p", "udp", "-m", "mark", "!", "--mark", mark, "-m", "udp", "--sport", "53", "-j", "CT", "--zone", "1")
}

// HostProbe returns the host-namespace rule that SNATs node-local (kubelet)
// TCP to enrolled pod IPs (ipsets ProbeIPSetV4/V6) to the probe address, so
// the pod rules let probes through uncaptured. The jump is inserted first in
// nat POSTROUTING.
func HostProbe(ipv6 bool) RuleSet {
	var rs RuleSet
	fams := []Family{IPv4}
	if ipv6 {
		fams = append(fams, IPv6)
	}
	for _, f := range fams {
		set, src := ProbeIPSetV4, ProbeSNATv4
		if f == IPv6 {
			set, src = ProbeIPSetV6, ProbeSNATv6
		}
		rs.Owned = append(rs.Owned, ChainRef{f, "nat", ChainPostrouting})
		rs.Rules = append(rs.Rules,
			Rule{f, "nat", "POSTROUTING", []string{"-j", ChainPostrouting}},
			Rule{f, "nat", ChainPostrouting, []string{"-p", "tcp", "-m", "owner", "--socket-exists",
				"-m", "set", "--match-set", set, "dst", "-j", "SNAT", "--to-source", src}})
	}
	return rs
}

func port(p uint16) string { return strconv.Itoa(int(p)) }

func sortedPorts(ps []uint16) []uint16 {
	out := slices.Clone(ps)
	slices.Sort(out)
	return slices.Compact(out)
}

// sortedRanges returns the ranges of family f, masked, sorted, deduplicated.
func sortedRanges(rs []netip.Prefix, f Family) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range rs {
		if r.Addr().Is4() == (f == IPv4) {
			out = append(out, r.Masked())
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}
