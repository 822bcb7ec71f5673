package rules

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// goldenSettings are the in-pod cases of TestGolden, rendered for nftables.
var goldenSettings = []struct {
	name string
	s    PodSettings
}{
	{"default", PodSettings{DNSCapture: true}},
	{"ipv6", PodSettings{IPv6: true, DNSCapture: true}},
	{"no-dns", PodSettings{}},
	{"ingress", PodSettings{DNSCapture: true, BypassInboundCapture: true, ExcludeInboundPorts: []uint16{8080}}},
	{"virtual-interfaces", PodSettings{DNSCapture: true, RerouteVirtualInterfaces: []string{"tap0", "net1"}}},
	{"exclusions-dns", PodSettings{
		IPv6: true, DNSCapture: true,
		RerouteVirtualInterfaces: []string{"tap0"},
		ExcludeOutboundPorts:     []uint16{9090, 3306, 9090},
		ExcludeOutboundIPRanges:  prefixes("10.96.0.10/32", "192.168.0.0/16", "fd00::/8", "10.96.0.10/32"),
		ExcludeInboundPorts:      []uint16{15020, 8080},
	}},
	{"exclude-port-53", PodSettings{DNSCapture: true, ExcludeOutboundPorts: []uint16{53}}},
}

func TestGoldenNFT(t *testing.T) {
	for _, tc := range goldenSettings {
		t.Run(tc.name, func(t *testing.T) {
			tables, err := NFTables(mustInPod(t, tc.s))
			if err != nil {
				t.Fatal(err)
			}
			got := RenderNFT(tables)
			path := filepath.Join("testdata", tc.name+".nft")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs from the rendered tables (run with -update if intended):\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

// Every rule of every in-pod case has a translation, and an IPv4-only set
// leaves IPv6 alone: every rule names its family.
func TestNFTRulesArePinnedToTheirFamily(t *testing.T) {
	for _, tc := range goldenSettings {
		tables, err := NFTables(mustInPod(t, tc.s))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, tb := range tables {
			for _, c := range tb.Chains {
				for _, r := range c.Rules {
					if strings.HasPrefix(r, "jump ") {
						continue
					}
					v4 := strings.HasPrefix(r, "meta nfproto ipv4 ") || strings.Contains(r, "ip saddr ") || strings.Contains(r, "ip daddr ")
					v6 := strings.HasPrefix(r, "meta nfproto ipv6 ") || strings.Contains(r, "ip6 saddr ") || strings.Contains(r, "ip6 daddr ")
					if v4 == v6 {
						t.Errorf("%s: %s %s: rule %q is not pinned to one family", tc.name, tb.Name, c.Name, r)
					}
					if v6 && !tc.s.IPv6 {
						t.Errorf("%s: IPv6 rule %q in an IPv4-only set", tc.name, r)
					}
				}
			}
		}
	}
}

func TestNFTUntranslatableRuleFails(t *testing.T) {
	// The host probe rule matches an ipset and the socket owner: no
	// translation, so the nft applier refuses it instead of dropping them.
	if _, err := NFTables(HostProbe(false)); err == nil || !strings.Contains(err.Error(), "no nftables translation") {
		t.Fatalf("NFTables(HostProbe) = %v, want a translation error", err)
	}
}

// A listing as nft prints it (tabs, counters, priority names, handles)
// parses back into the translation, and differences are reported per rule.
func TestNFTParseAndDiff(t *testing.T) {
	want, err := NFTables(mustInPod(t, PodSettings{DNSCapture: true}))
	if err != nil {
		t.Fatal(err)
	}
	owned := NFTOwnedTables(mustInPod(t, PodSettings{DNSCapture: true}))
	have := map[string]NFTTable{}
	for _, tb := range want {
		listing := RenderNFT([]NFTTable{tb})
		listing = strings.ReplaceAll(listing, "counter ", "counter packets 12 bytes 720 ")
		listing = strings.ReplaceAll(listing, "priority -100;", "priority dstnat;")
		listing = strings.ReplaceAll(listing, "priority -300;", "priority raw;")
		got, err := parseNFTTable(listing)
		if err != nil {
			t.Fatal(err)
		}
		have[got.Name] = got
	}
	if d, rw := diffNFT(owned, have, want); !d.Empty() || len(rw) != 0 {
		t.Fatalf("round trip differs: rewrite %v\n%s", rw, d)
	}
	nat := have[NFTTableName("nat")]
	out := &nat.Chains[len(nat.Chains)-1]
	dropped := out.Rules[len(out.Rules)-1]
	out.Rules = append(out.Rules[:len(out.Rules)-1], "tcp dport 2222 counter accept")
	delete(have, NFTTableName("raw"))
	d, rw := diffNFT(owned, have, want)
	for _, line := range []string{
		"+ nft inet istio-ambient-nat istio-output " + dropped,
		"- nft inet istio-ambient-nat istio-output tcp dport 2222 counter accept",
		"+ nft inet istio-ambient-raw output jump istio-output",
	} {
		if !strings.Contains(d.String(), line+"\n") {
			t.Errorf("diff lacks %q:\n%s", line, d)
		}
	}
	if strings.Join(rw, ",") != "istio-ambient-nat,istio-ambient-raw" {
		t.Errorf("rewrite = %v", rw)
	}
}
