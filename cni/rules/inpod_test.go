package rules

import (
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		rs   func() (RuleSet, error)
	}{
		{"default", func() (RuleSet, error) { return InPod(PodSettings{DNSCapture: true}) }},
		{"ipv6", func() (RuleSet, error) { return InPod(PodSettings{IPv6: true, DNSCapture: true}) }},
		{"no-dns", func() (RuleSet, error) { return InPod(PodSettings{}) }},
		{"ingress", func() (RuleSet, error) {
			return InPod(PodSettings{DNSCapture: true, BypassInboundCapture: true, ExcludeInboundPorts: []uint16{8080}})
		}},
		{"virtual-interfaces", func() (RuleSet, error) {
			return InPod(PodSettings{DNSCapture: true, RerouteVirtualInterfaces: []string{"tap0", "net1"}})
		}},
		{"exclusions-dns", func() (RuleSet, error) {
			return InPod(PodSettings{
				IPv6: true, DNSCapture: true,
				RerouteVirtualInterfaces: []string{"tap0"},
				ExcludeOutboundPorts:     []uint16{9090, 3306, 9090},
				ExcludeOutboundIPRanges:  prefixes("10.96.0.10/32", "192.168.0.0/16", "fd00::/8", "10.96.0.10/32"),
				ExcludeInboundPorts:      []uint16{15020, 8080},
			})
		}},
		{"exclude-port-53", func() (RuleSet, error) {
			return InPod(PodSettings{DNSCapture: true, ExcludeOutboundPorts: []uint16{53}})
		}},
		{"hostprobe", func() (RuleSet, error) { return HostProbe(true), nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := tc.rs()
			if err != nil {
				t.Fatal(err)
			}
			got := rs.Render()
			path := filepath.Join("testdata", tc.name+".golden")
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
				t.Errorf("%s differs from the rendered rules (run with -update if intended):\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

// ruleIndex returns the position of the first rule in chain whose spec
// contains all of substrs, or -1.
func ruleIndex(rs RuleSet, f Family, table, chain string, substrs ...string) int {
	for i, r := range rs.Rules {
		if r.Family != f || r.Table != table || r.Chain != chain {
			continue
		}
		ok := true
		for _, s := range substrs {
			ok = ok && strings.Contains(r.Spec(), s)
		}
		if ok {
			return i
		}
	}
	return -1
}

// The properties the exclusion extension promises, independent of the golden
// text: each exclusion comes before every redirect that could catch it.
func TestExclusionsPrecedeRedirects(t *testing.T) {
	rs, err := InPod(PodSettings{
		IPv6: true, DNSCapture: true,
		ExcludeOutboundPorts:    []uint16{9090},
		ExcludeOutboundIPRanges: prefixes("10.96.0.10/32", "fd00::/8"),
		ExcludeInboundPorts:     []uint16{8080},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		f            Family
		rng          string
		rawOut, rawP string
	}{
		{IPv4, "10.96.0.10/32", "-d 10.96.0.10/32", "-s 10.96.0.10/32"},
		{IPv6, "fd00::/8", "-d fd00::/8", "-s fd00::/8"},
	} {
		excludeRange := ruleIndex(rs, c.f, "nat", ChainOutput, "-d "+c.rng, "-j RETURN")
		excludePort := ruleIndex(rs, c.f, "nat", ChainOutput, "--dport 9090", "-j RETURN")
		if excludeRange < 0 || excludePort < 0 {
			t.Fatalf("%s: exclusion rules missing: range %d port %d", c.f, excludeRange, excludePort)
		}
		for _, redirect := range []string{"--to-ports 15053", "--to-ports 15001"} {
			i := ruleIndex(rs, c.f, "nat", ChainOutput, redirect)
			if i < 0 || i < excludeRange || i < excludePort {
				t.Errorf("%s: redirect %q at %d, exclusions at %d/%d", c.f, redirect, i, excludeRange, excludePort)
			}
		}
		inPort := ruleIndex(rs, c.f, "nat", ChainPrerouting, "--dport 8080", "-j RETURN")
		inRedirect := ruleIndex(rs, c.f, "nat", ChainPrerouting, "--to-ports 15006")
		if inPort < 0 || inRedirect < inPort {
			t.Errorf("%s: inbound exclusion at %d, 15006 redirect at %d", c.f, inPort, inRedirect)
		}
		for _, raw := range []struct{ chain, match string }{{ChainOutput, c.rawOut}, {ChainPrerouting, c.rawP}} {
			ret := ruleIndex(rs, c.f, "raw", raw.chain, raw.match, "-j RETURN")
			ct := ruleIndex(rs, c.f, "raw", raw.chain, "CT --zone 1")
			if ret < 0 || ct < ret {
				t.Errorf("%s raw %s: exclusion at %d, CT zone at %d", c.f, raw.chain, ret, ct)
			}
		}
	}
}

func TestDNSCaptureSwitches(t *testing.T) {
	for _, tc := range []struct {
		name    string
		s       PodSettings
		wantDNS bool
	}{
		{"on", PodSettings{DNSCapture: true}, true},
		{"off", PodSettings{}, false},
		{"port 53 excluded", PodSettings{DNSCapture: true, ExcludeOutboundPorts: []uint16{80, 53}}, false},
		{"other port excluded", PodSettings{DNSCapture: true, ExcludeOutboundPorts: []uint16{80}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := InPod(tc.s)
			if err != nil {
				t.Fatal(err)
			}
			gotRedirect := ruleIndex(rs, IPv4, "nat", ChainOutput, "--to-ports 15053") >= 0
			gotRaw := ruleIndex(rs, IPv4, "raw", ChainOutput, "CT --zone 1") >= 0 ||
				ruleIndex(rs, IPv4, "raw", "OUTPUT", "-j "+ChainOutput) >= 0
			if gotRedirect != tc.wantDNS || gotRaw != tc.wantDNS {
				t.Errorf("DNS redirect %v, raw rules %v; want %v", gotRedirect, gotRaw, tc.wantDNS)
			}
			// raw chains stay owned either way so a later apply removes them.
			if !containsRef(rs.Owned, ChainRef{IPv4, "raw", ChainOutput}) {
				t.Errorf("raw %s not owned", ChainOutput)
			}
		})
	}
}

func containsRef(refs []ChainRef, c ChainRef) bool {
	for _, r := range refs {
		if r == c {
			return true
		}
	}
	return false
}

func TestInPodRejectsInvalidSettings(t *testing.T) {
	for _, s := range []PodSettings{
		{RerouteVirtualInterfaces: []string{"a-very-long-interface-name"}},
		{RerouteVirtualInterfaces: []string{""}},
		{ExcludeInboundPorts: []uint16{0}},
		{ExcludeOutboundIPRanges: []netip.Prefix{{}}},
	} {
		if _, err := InPod(s); !errors.Is(err, ErrInvalidSettings) {
			t.Errorf("InPod(%+v) = %v, want ErrInvalidSettings", s, err)
		}
	}
}

func TestInPodIsDeterministic(t *testing.T) {
	a, _ := InPod(PodSettings{DNSCapture: true, ExcludeOutboundPorts: []uint16{443, 80, 443},
		ExcludeOutboundIPRanges: prefixes("10.1.2.3/8", "192.168.0.0/16")})
	b, _ := InPod(PodSettings{DNSCapture: true, ExcludeOutboundPorts: []uint16{80, 443},
		ExcludeOutboundIPRanges: prefixes("192.168.0.0/16", "10.0.0.0/8")})
	if a.Render() != b.Render() {
		t.Fatalf("equivalent settings render differently:\n%s\n%s", a.Render(), b.Render())
	}
}
