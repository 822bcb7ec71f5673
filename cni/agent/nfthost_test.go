package agent

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
)

// An nftables agent's host side takes over the iptables agent's: the
// captured pod IPs move from the ipsets into the nftables sets, then the
// iptables rule and the ipsets go.
func TestNFTHostMigratesFromIPTables(t *testing.T) {
	roottest.Require(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("nft not found (apt package nftables, make deps): %v", err)
	}
	host := netnstest.New(t, "host")
	old := &KernelHost{IPv6: true, Mode: rules.ModeNFT}
	pods := []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd01::3")}
	nh := &NFTHost{NFTHost: rules.NewNFTHost(true), Old: old}
	err := host.Do(func() error {
		if err := old.Setup(); err != nil {
			return err
		}
		if err := old.AddPodIPs(pods); err != nil {
			return err
		}
		if err := nh.Setup(); err != nil {
			return err
		}
		return nh.Setup() // again: nothing left to migrate
	})
	if err != nil {
		t.Fatal(err)
	}
	got := host.Exec(t, "nft", "list", "table", "inet", rules.NFTHostTable)
	for _, want := range []string{"elements = { 10.1.2.3 }", "elements = { fd01::3 }", "snat ip to " + rules.ProbeSNATv4} {
		if !strings.Contains(got, want) {
			t.Errorf("nftables host table lacks %q:\n%s", want, got)
		}
	}
	if out := host.Exec(t, "iptables-nft-save"); strings.Contains(out, rules.ChainPostrouting) {
		t.Errorf("iptables probe rule left:\n%s", out)
	}
	if out, err := exec.Command("ip", "netns", "exec", host.Name, "ipset", "list", "-n").CombinedOutput(); err != nil || strings.Contains(string(out), "istio") {
		t.Errorf("ipsets left (%v):\n%s", err, out)
	}
	if err := host.Do(nh.Teardown); err != nil {
		t.Fatal(err)
	}
}
