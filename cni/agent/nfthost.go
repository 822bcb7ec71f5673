package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
)

// NFTHost is Host in native nftables (rules.NFTHost), for an agent with
// Config.NFTables. It takes over from an iptables agent's KernelHost.
type NFTHost struct {
	*rules.NFTHost
	// Old is the iptables host side an earlier agent may have set up:
	// Setup copies its ipsets' members into the nftables sets, and only
	// then removes its rule and ipsets, so probes to captured pods are
	// SNATed throughout. nil: nothing to migrate.
	Old *KernelHost
}

// Setup implements Host.
func (h *NFTHost) Setup() error {
	if err := h.NFTHost.Setup(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if h.Old == nil {
		return nil
	}
	var members []netip.Addr
	found := false
	for _, s := range h.Old.sets() {
		ips, ok, err := ipsetMembers(s[0])
		if err != nil {
			return err
		}
		found = found || ok
		members = append(members, ips...)
	}
	if !found {
		return nil
	}
	if err := h.AddPodIPs(members); err != nil {
		return fmt.Errorf("agent: copying probe ipsets into nftables: %w", err)
	}
	if err := h.Old.Teardown(); err != nil {
		return fmt.Errorf("agent: removing the iptables probe rule after the move to nftables: %w", err)
	}
	return nil
}

// ipsetMembers lists an ipset's addresses; ok is false when the set (or
// the ipset command) does not exist.
func ipsetMembers(name string) (ips []netip.Addr, ok bool, err error) {
	if _, err := exec.LookPath("ipset"); err != nil {
		return nil, false, nil
	}
	out, err := exec.Command("ipset", "list", name, "-o", "save").CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "does not exist") {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("agent: ipset list %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "add" || f[1] != name {
			continue
		}
		ip, err := netip.ParseAddr(f[2])
		if err != nil {
			errs = append(errs, fmt.Errorf("agent: ipset %s member %q: %w", name, f[2], err))
			continue
		}
		ips = append(ips, ip)
	}
	return ips, true, errors.Join(errs...)
}
