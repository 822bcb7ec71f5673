package agent

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
)

// Host is the node side of kubelet probes (§3.5): the SNAT rule in the
// node's network namespace and the ipsets of captured pod IPs it matches.
type Host interface {
	// Setup creates the ipsets and installs rules.HostProbe. Idempotent.
	Setup() error
	// AddPodIPs and DelPodIPs add and remove captured pod IPs. Idempotent.
	AddPodIPs(ips []netip.Addr) error
	DelPodIPs(ips []netip.Addr) error
	// Teardown removes the rule and the ipsets (uninstall).
	Teardown() error
}

// KernelHost runs the ipset command and the kernel rule applier in the
// calling process's network namespace (the node's).
type KernelHost struct {
	// IPv6 also manages the v6 set and rule.
	IPv6 bool
	// Mode is the iptables variant.
	Mode rules.Mode
}

func ipset(args ...string) error {
	out, err := exec.Command("ipset", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("agent: ipset %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (h *KernelHost) sets() [][2]string {
	out := [][2]string{{rules.ProbeIPSetV4, "inet"}}
	if h.IPv6 {
		out = append(out, [2]string{rules.ProbeIPSetV6, "inet6"})
	}
	return out
}

// Setup implements Host.
func (h *KernelHost) Setup() error {
	for _, s := range h.sets() {
		if err := ipset("create", s[0], "hash:ip", "family", s[1], "-exist"); err != nil {
			return err
		}
	}
	if err := rules.NewKernelApplier(rules.KernelConfig{Mode: h.Mode}).Apply(rules.HostProbe(h.IPv6)); err != nil {
		return fmt.Errorf("agent: host probe rule: %w", err)
	}
	return nil
}

func (h *KernelHost) setFor(ip netip.Addr) (string, bool) {
	if ip.Is4() || ip.Is4In6() {
		return rules.ProbeIPSetV4, true
	}
	return rules.ProbeIPSetV6, h.IPv6
}

// AddPodIPs implements Host.
func (h *KernelHost) AddPodIPs(ips []netip.Addr) error {
	for _, ip := range ips {
		if set, ok := h.setFor(ip); ok {
			if err := ipset("add", set, ip.Unmap().String(), "-exist"); err != nil {
				return err
			}
		}
	}
	return nil
}

// DelPodIPs implements Host.
func (h *KernelHost) DelPodIPs(ips []netip.Addr) error {
	for _, ip := range ips {
		if set, ok := h.setFor(ip); ok {
			if err := ipset("del", set, ip.Unmap().String(), "-exist"); err != nil {
				return err
			}
		}
	}
	return nil
}

// Teardown implements Host.
func (h *KernelHost) Teardown() error {
	if err := rules.NewKernelApplier(rules.KernelConfig{Mode: h.Mode}).Remove(rules.HostProbe(h.IPv6)); err != nil {
		return fmt.Errorf("agent: host probe rule: %w", err)
	}
	for _, s := range h.sets() {
		if err := ipset("destroy", s[0]); err != nil && !strings.Contains(err.Error(), "does not exist") {
			return err
		}
	}
	return nil
}
