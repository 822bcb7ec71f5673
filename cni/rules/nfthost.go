package rules

import (
	"fmt"
	"net/netip"
	"strings"
)

// NFTHost is HostProbe in native nftables, for the node's network namespace
// (the calling thread's): table inet istio-ambient-nat (Istio's name, on the
// host too) holds sets ProbeIPSetV4/V6 of captured pod IPs, in place of the
// ipsets, and a postrouting chain that SNATs node-local TCP to them to the
// probe address. "meta skuid >= 0" matches exactly the packets with a full
// local socket, as iptables' "-m owner --socket-exists" does: forwarded
// traffic has none and keeps its source.
type NFTHost struct {
	// IPv6 also manages the v6 set and rule.
	IPv6 bool
	nft  nftRunner
}

// NewNFTHost returns the nftables host side, running the nft binary.
func NewNFTHost(ipv6 bool) *NFTHost { return &NFTHost{IPv6: ipv6, nft: &nftBinary{}} }

// NFTHostTable is the host table of NFTHost.
var NFTHostTable = NFTTableName("nat")

// HostScript is the transaction Setup runs: sets created if missing (their
// elements survive a restarted agent), the chain created if missing and
// refilled in the same batch.
func (h *NFTHost) HostScript() string {
	var b strings.Builder
	t := NFTHostTable
	fmt.Fprintf(&b, "add table inet %s\n", t)
	fmt.Fprintf(&b, "add set inet %s %s { type ipv4_addr; }\n", t, ProbeIPSetV4)
	if h.IPv6 {
		fmt.Fprintf(&b, "add set inet %s %s { type ipv6_addr; }\n", t, ProbeIPSetV6)
	}
	fmt.Fprintf(&b, "add chain inet %s postrouting { type nat hook postrouting priority 100; policy accept; }\n", t)
	fmt.Fprintf(&b, "flush chain inet %s postrouting\n", t)
	fmt.Fprintf(&b, "add rule inet %s postrouting meta l4proto tcp meta skuid >= 0 ip daddr @%s counter snat ip to %s\n", t, ProbeIPSetV4, ProbeSNATv4)
	if h.IPv6 {
		fmt.Fprintf(&b, "add rule inet %s postrouting meta l4proto tcp meta skuid >= 0 ip6 daddr @%s counter snat ip6 to %s\n", t, ProbeIPSetV6, ProbeSNATv6)
	}
	return b.String()
}

// Setup installs the table, sets and rule. Idempotent.
func (h *NFTHost) Setup() error {
	if err := h.nft.Run(h.HostScript()); err != nil {
		return fmt.Errorf("rules: nftables host probe rule: %w", err)
	}
	return nil
}

// elements groups ips by set, dropping IPv6 ones without IPv6.
func (h *NFTHost) elements(ips []netip.Addr) map[string][]string {
	out := map[string][]string{}
	for _, ip := range ips {
		ip = ip.Unmap()
		switch {
		case ip.Is4():
			out[ProbeIPSetV4] = append(out[ProbeIPSetV4], ip.String())
		case h.IPv6:
			out[ProbeIPSetV6] = append(out[ProbeIPSetV6], ip.String())
		}
	}
	return out
}

// AddPodIPs adds captured pod IPs to the sets. Idempotent.
func (h *NFTHost) AddPodIPs(ips []netip.Addr) error {
	var b strings.Builder
	for _, set := range []string{ProbeIPSetV4, ProbeIPSetV6} {
		if els := h.elements(ips)[set]; len(els) > 0 {
			fmt.Fprintf(&b, "add element inet %s %s { %s }\n", NFTHostTable, set, strings.Join(els, ", "))
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return h.nft.Run(b.String())
}

// DelPodIPs removes pod IPs from the sets; absent ones are no error (each
// is added first in the same batch, as nft has no "delete if present").
func (h *NFTHost) DelPodIPs(ips []netip.Addr) error {
	var b strings.Builder
	for _, set := range []string{ProbeIPSetV4, ProbeIPSetV6} {
		if els := h.elements(ips)[set]; len(els) > 0 {
			list := strings.Join(els, ", ")
			fmt.Fprintf(&b, "add element inet %s %s { %s }\ndelete element inet %s %s { %s }\n",
				NFTHostTable, set, list, NFTHostTable, set, list)
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return h.nft.Run(b.String())
}

// Teardown deletes the table (rule and sets). Idempotent.
func (h *NFTHost) Teardown() error {
	return h.nft.Run(fmt.Sprintf("add table inet %s\ndelete table inet %s\n", NFTHostTable, NFTHostTable))
}
