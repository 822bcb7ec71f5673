// Package rules decides and applies the traffic-capture rules of ambient mode:
// the in-pod iptables rules and policy routes that send a pod's traffic to
// ztunnel (reference §3.5), and the host-side probe SNAT rule.
//
// Deciding is pure: InPod and HostProbe turn settings into a RuleSet (ordered
// iptables rules in canonical `iptables -S` form, plus ip rules and routes),
// tested against golden files. ParseAnnotations turns pod annotations into
// PodSettings. Doing is behind the Applier interface: NewKernelApplier runs
// iptables (go-iptables) and netlink inside a network namespace;
// NewNFTApplier keeps the same rules as native nftables inet tables (NFTables
// translates them; one `nft -f -` transaction per change) and migrates a pod
// off the iptables chains an earlier agent left; Fake keeps the iptables
// state in memory, keyed by table and chain, for unit tests.
//
// It does not decide whether a pod is enrolled, talk to Kubernetes or ztunnel,
// or manage ipsets (the host probe rule only references the ipset by name).
package rules

import (
	"fmt"
	"net/netip"
	"strings"
)

// Constants shared with ztunnel (reference §3.5).
const (
	// ZtunnelMark is the SO_MARK ztunnel puts on all its sockets (0x539).
	ZtunnelMark = 1337
	// ConnMark marks connections ztunnel made to the app with a spoofed
	// source, so replies are policy-routed back to ztunnel (0x111).
	ConnMark = 0x111
	// MarkMask masks both marks.
	MarkMask = 0xfff
	// RouteTable is the policy routing table holding the local default route.
	RouteTable = 100
	// RulePriority is the preference of the "fwmark ConnMark lookup
	// RouteTable" ip rule.
	RulePriority = 32764

	PortOutbound = 15001 // ztunnel outbound capture listener
	PortInbound  = 15006 // ztunnel inbound plaintext capture listener
	PortHBONE    = 15008 // ztunnel inbound HBONE listener (never redirected)
	PortDNS      = 15053 // ztunnel DNS proxy (UDP and TCP)

	// ProbeSNATv4 and ProbeSNATv6 are the source addresses kubelet probes
	// are SNATed to on the host, so the pod rules can let them through.
	ProbeSNATv4 = "169.254.7.127"
	ProbeSNATv6 = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"

	// Chain names owned by these rules.
	ChainPrerouting  = "ISTIO_PRERT"
	ChainOutput      = "ISTIO_OUTPUT"
	ChainPostrouting = "ISTIO_POSTRT"

	// Host ipsets holding enrolled pod IPs (managed elsewhere).
	ProbeIPSetV4 = "istio-inpod-probes-v4"
	ProbeIPSetV6 = "istio-inpod-probes-v6"
)

// Family is an IP family: which of iptables / ip6tables a rule belongs to.
type Family uint8

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "ipv4"
	case IPv6:
		return "ipv6"
	}
	return fmt.Sprintf("family(%d)", uint8(f))
}

// ChainRef names one chain of one table of one family.
type ChainRef struct {
	Family Family
	Table  string // "mangle", "nat", "raw"
	Chain  string
}

func (c ChainRef) String() string {
	if strings.HasPrefix(c.Table, "inet ") { // nftables (see diffNFT)
		return strings.TrimSpace("nft " + c.Table + " " + c.Chain)
	}
	return fmt.Sprintf("%s -t %s %s", c.Family, c.Table, c.Chain)
}

// Rule is one iptables rule. Args are in the canonical form `iptables -S`
// prints (e.g. "-d 127.0.0.1/32", "-p tcp -m tcp --dport 53"), so the rules
// read back from the kernel compare equal as text; the kernel tests check this
// for both the legacy and the nft variant. A Rule in a built-in chain
// (PREROUTING, OUTPUT, ...) is a jump into one of our chains.
type Rule struct {
	Family Family
	Table  string
	Chain  string
	Args   []string
}

// Ref is the chain the rule lives in.
func (r Rule) Ref() ChainRef { return ChainRef{r.Family, r.Table, r.Chain} }

// Spec is the rule as `iptables -S` prints it, without the "-A CHAIN".
func (r Rule) Spec() string { return strings.Join(r.Args, " ") }

func (r Rule) String() string {
	if strings.HasPrefix(r.Table, "inet ") { // nftables (see diffNFT)
		return fmt.Sprintf("nft %s %s %s", r.Table, r.Chain, r.Spec())
	}
	return fmt.Sprintf("%s -t %s -A %s %s", r.Family, r.Table, r.Chain, r.Spec())
}

// IPRule is a policy routing rule "fwmark Mark/Mask pref Priority lookup Table".
type IPRule struct {
	Family   Family
	Mark     uint32
	Mask     uint32
	Priority int
	Table    int
}

func (r IPRule) String() string {
	return fmt.Sprintf("ip -%d rule add fwmark %#x/%#x pref %d lookup %d", r.Family, r.Mark, r.Mask, r.Priority, r.Table)
}

// LocalRoute is "ip route add local Dst dev Dev table Table": it makes every
// destination local for packets routed through Table.
type LocalRoute struct {
	Dst   netip.Prefix
	Dev   string
	Table int
}

// Family is the route's family, from Dst.
func (r LocalRoute) Family() Family {
	if r.Dst.Addr().Is4() {
		return IPv4
	}
	return IPv6
}

func (r LocalRoute) String() string {
	return fmt.Sprintf("ip -%d route add local %s dev %s table %d", r.Family(), r.Dst, r.Dev, r.Table)
}

// RuleSet is the complete desired state of one network namespace's capture
// rules. Applying it converges the Owned chains to exactly Rules (chains
// without rules and jumps are deleted) and ensures IPRules and Routes exist.
type RuleSet struct {
	// Owned lists every chain this rule set manages, including chains it
	// leaves empty in this configuration (e.g. raw chains with DNS capture
	// off), so that applying it removes what an earlier set put there.
	Owned []ChainRef
	// Rules in order: within a chain, the order is the evaluation order.
	Rules []Rule
	// IPRules and Routes are the policy routing items.
	IPRules []IPRule
	Routes  []LocalRoute
}

// Families lists the families the set owns chains in, IPv4 first.
func (rs RuleSet) Families() []Family {
	var out []Family
	for _, f := range []Family{IPv4, IPv6} {
		for _, c := range rs.Owned {
			if c.Family == f {
				out = append(out, f)
				break
			}
		}
	}
	return out
}

// tableOrder is the order tables are rendered and applied in.
func tableOrder() []string { return []string{"mangle", "nat", "raw"} }

// builtinChains are the chains iptables creates itself, by table; jumps into
// owned chains are only looked for here.
func builtinChains(table string) []string {
	switch table {
	case "nat":
		return []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"}
	case "raw":
		return []string{"PREROUTING", "OUTPUT"}
	case "filter":
		return []string{"INPUT", "FORWARD", "OUTPUT"}
	default: // mangle
		return []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}
	}
}

func isBuiltin(table, chain string) bool {
	for _, b := range builtinChains(table) {
		if b == chain {
			return true
		}
	}
	return false
}

// Render prints the set in an iptables-save-like form, one block per family
// and table, followed by the policy routing items as ip(8) commands. It is
// the golden-file format; it is not fed to iptables-restore.
func (rs RuleSet) Render() string {
	var b strings.Builder
	for _, f := range rs.Families() {
		tool := "iptables"
		if f == IPv6 {
			tool = "ip6tables"
		}
		fmt.Fprintf(&b, "# %s\n", tool)
		for _, table := range tableOrder() {
			var chains []string
			for _, c := range rs.Owned {
				if c.Family == f && c.Table == table && rs.hasRules(c) {
					chains = append(chains, c.Chain)
				}
			}
			if len(chains) == 0 {
				continue
			}
			fmt.Fprintf(&b, "*%s\n", table)
			for _, c := range chains {
				fmt.Fprintf(&b, ":%s - [0:0]\n", c)
			}
			for _, r := range rs.Rules {
				if r.Family == f && r.Table == table {
					fmt.Fprintf(&b, "-A %s %s\n", r.Chain, r.Spec())
				}
			}
			b.WriteString("COMMIT\n")
		}
	}
	if len(rs.IPRules)+len(rs.Routes) > 0 {
		b.WriteString("# policy routing\n")
	}
	for _, r := range rs.IPRules {
		fmt.Fprintf(&b, "%s\n", r)
	}
	for _, r := range rs.Routes {
		fmt.Fprintf(&b, "%s\n", r)
	}
	return b.String()
}

func (rs RuleSet) hasRules(c ChainRef) bool {
	for _, r := range rs.Rules {
		if r.Ref() == c {
			return true
		}
	}
	return false
}
