package rules

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"sync"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// Mode selects the iptables variant.
type Mode string

const (
	// ModeDefault runs `iptables` / `ip6tables` from PATH, whatever
	// variant the system's alternatives point at.
	ModeDefault Mode = ""
	// ModeLegacy runs iptables-legacy / ip6tables-legacy (x_tables).
	ModeLegacy Mode = "legacy"
	// ModeNFT runs iptables-nft / ip6tables-nft (nf_tables backend).
	ModeNFT Mode = "nft"
)

func (m Mode) binary(f Family) string {
	name := "iptables"
	if f == IPv6 {
		name = "ip6tables"
	}
	if m == ModeDefault {
		return name
	}
	return name + "-" + string(m)
}

// DetectMode picks the iptables variant for pod rules by looking at the
// calling thread's network namespace (the host's, in the agent): the variant
// that already holds more rules wins (kubelet and kube-proxy use one of them,
// and mixing both on one node makes rules hard to reason about); with no
// rules in either, or a tie, ModeDefault. Run it once at agent start-up. It
// only reads (`iptables-legacy-save`, `iptables-nft-save` and the ip6tables
// equivalents); a variant whose binary is missing counts as empty.
func DetectMode() Mode {
	count := func(m Mode) int {
		n := 0
		for _, f := range []Family{IPv4, IPv6} {
			out, err := exec.Command(m.binary(f) + "-save").Output()
			if err != nil {
				continue
			}
			for _, line := range bytes.Split(out, []byte("\n")) {
				if bytes.HasPrefix(line, []byte("-A ")) {
					n++
				}
			}
		}
		return n
	}
	legacy, nft := count(ModeLegacy), count(ModeNFT)
	switch {
	case legacy > nft:
		return ModeLegacy
	case nft > legacy:
		return ModeNFT
	}
	return ModeDefault
}

// KernelConfig configures NewKernelApplier.
type KernelConfig struct {
	// Netns is the namespace to act in. nil means the calling thread's
	// namespace (the host namespace, for HostProbe rules; or tests).
	Netns *netns.Handle
	// Mode is the iptables variant (see DetectMode).
	Mode Mode
	// MigrateFromNFT makes Apply delete the nftables tables of the rule
	// set (NFTOwnedTables) that an nftables-backed agent left, after the
	// iptables rules are in; Check reports them and Remove deletes them
	// too. Without the nft binary there is nothing to look for.
	MigrateFromNFT bool
}

// NewKernelApplier returns an Applier that runs iptables (through
// go-iptables, which execs the binary) and netlink inside cfg.Netns. Every
// call enters the namespace once with Netns.Do; exec'd iptables processes
// inherit the locked thread's namespace, and netlink sockets are opened
// inside it. The iptables binaries are looked up on first use, so an
// IPv4-only rule set works without ip6tables.
func NewKernelApplier(cfg KernelConfig) Applier {
	k := &kernel{mode: cfg.Mode, ipt: make(map[Family]*kernelTables)}
	e := &engine{
		tables: k.tables,
		routing: func() (routing, func(), error) {
			h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
			if err != nil {
				return nil, nil, fmt.Errorf("rules: netlink: %w", err)
			}
			return netlinkRouting{h}, h.Close, nil
		},
		do: cfg.Netns.Do,
	}
	if cfg.MigrateFromNFT {
		return &fromNFT{engine: e, nft: &nftBinary{}}
	}
	return e
}

// kernel holds the go-iptables handles, created on first use.
type kernel struct {
	mode Mode
	mu   sync.Mutex
	ipt  map[Family]*kernelTables
}

// kernelTables reads through go-iptables and writes through
// <binary>-restore.
type kernelTables struct {
	*goipt.IPTables
	restore string // iptables-restore binary of the variant
}

// restoreWait is iptables-restore's -w: how long it waits for the xtables
// lock another iptables process holds.
const restoreWait = "5"

// Restore implements iptables: one `iptables-restore --noflush` run, which
// commits the table's changes in one kernel transaction (one replacement of
// the x_tables blob for legacy, one nf_tables batch for nft).
func (k *kernelTables) Restore(table string, lines []string) error {
	var in bytes.Buffer
	in.WriteString("*" + table + "\n")
	for _, l := range lines {
		in.WriteString(l + "\n")
	}
	in.WriteString("COMMIT\n")
	cmd := exec.Command(k.restore, "--noflush", "-w", restoreWait)
	cmd.Stdin = &in
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s (input:\n%s)", k.restore, err, bytes.TrimSpace(out), in.String())
	}
	return nil
}

func (k *kernel) tables(f Family) (iptables, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if t, ok := k.ipt[f]; ok {
		return t, nil
	}
	proto := goipt.ProtocolIPv4
	if f == IPv6 {
		proto = goipt.ProtocolIPv6
	}
	t, err := goipt.New(goipt.IPFamily(proto), goipt.Path(k.mode.binary(f)), goipt.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("rules: %s: %w", k.mode.binary(f), err)
	}
	restore, err := exec.LookPath(k.mode.binary(f) + "-restore")
	if err != nil {
		return nil, fmt.Errorf("rules: %s-restore: %w", k.mode.binary(f), err)
	}
	kt := &kernelTables{IPTables: t, restore: restore}
	k.ipt[f] = kt
	return kt, nil
}

// netlinkRouting manages the policy routing items over a netlink handle
// opened inside the namespace.
type netlinkRouting struct{ h *netlink.Handle }

func nlFamily(f Family) int {
	if f == IPv6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

func (r netlinkRouting) findIPRules(x IPRule) ([]netlink.Rule, error) {
	mask := x.Mask
	filter := netlink.NewRule()
	filter.Mark, filter.Mask, filter.Table, filter.Priority = x.Mark, &mask, x.Table, x.Priority
	rules, err := r.h.RuleListFiltered(nlFamily(x.Family), filter,
		netlink.RT_FILTER_MARK|netlink.RT_FILTER_MASK|netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PRIORITY)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", x, err)
	}
	return rules, nil
}

func (r netlinkRouting) HasIPRule(x IPRule) (bool, error) {
	rules, err := r.findIPRules(x)
	return len(rules) > 0, err
}

func (r netlinkRouting) AddIPRule(x IPRule) error {
	mask := x.Mask
	rule := netlink.NewRule()
	rule.Family, rule.Mark, rule.Mask, rule.Table, rule.Priority = nlFamily(x.Family), x.Mark, &mask, x.Table, x.Priority
	return r.h.RuleAdd(rule)
}

func (r netlinkRouting) DelIPRule(x IPRule) error {
	rules, err := r.findIPRules(x)
	for _, rule := range rules {
		rule.Family = nlFamily(x.Family)
		if derr := r.h.RuleDel(&rule); derr != nil && !errors.Is(derr, unix.ENOENT) {
			err = errors.Join(err, fmt.Errorf("delete %s: %w", x, derr))
		}
	}
	return err
}

func (r netlinkRouting) route(x LocalRoute) (*netlink.Route, error) {
	link, err := r.h.LinkByName(x.Dev)
	if err != nil {
		return nil, fmt.Errorf("%s: link %s: %w", x, x.Dev, err)
	}
	return &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Dst:       &net.IPNet{IP: x.Dst.Addr().AsSlice(), Mask: net.CIDRMask(x.Dst.Bits(), x.Dst.Addr().BitLen())},
		Table:     x.Table,
		Type:      unix.RTN_LOCAL,
		Scope:     unix.RT_SCOPE_HOST,
		Family:    nlFamily(x.Family()),
	}, nil
}

// HasRoute reports whether the route exists. An IPv6 route on a device
// without IPv6 addresses (IPv6 disabled in the pod) cannot be added and is
// not needed, so it counts as present, as in Istio.
func (r netlinkRouting) HasRoute(x LocalRoute) (bool, error) {
	want, err := r.route(x)
	if err != nil {
		return false, err
	}
	if x.Family() == IPv6 {
		addrs, err := r.h.AddrList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: want.LinkIndex}}, netlink.FAMILY_V6)
		if err != nil {
			return false, fmt.Errorf("%s: addresses of %s: %w", x, x.Dev, err)
		}
		if len(addrs) == 0 {
			return true, nil
		}
	}
	routes, err := r.h.RouteListFiltered(want.Family, want,
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST|netlink.RT_FILTER_TYPE|netlink.RT_FILTER_OIF)
	if err != nil {
		return false, fmt.Errorf("list %s: %w", x, err)
	}
	return len(routes) > 0, nil
}

func (r netlinkRouting) AddRoute(x LocalRoute) error {
	rt, err := r.route(x)
	if err != nil {
		return err
	}
	return r.h.RouteReplace(rt)
}

func (r netlinkRouting) DelRoute(x LocalRoute) error {
	rt, err := r.route(x)
	if err != nil {
		return err
	}
	if err := r.h.RouteDel(rt); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete %s: %w", x, err)
	}
	return nil
}

func (m Mode) String() string {
	if m == ModeDefault {
		return "default"
	}
	return string(m)
}
