package rules

import (
	"slices"
	"strings"
	"testing"
)

func mustInPod(t *testing.T, s PodSettings) RuleSet {
	t.Helper()
	rs, err := InPod(s)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// assertMatches checks the fake holds exactly rs in every owned chain and
// exactly rs's jumps, and that Check agrees.
func assertMatches(t *testing.T, f *Fake, rs RuleSet) {
	t.Helper()
	for _, c := range rs.Owned {
		want, jumps := desired(rs, c)
		lines, err := f.Tables(c.Family).List(c.Table, c.Chain)
		if len(want) == 0 && len(jumps) == 0 {
			if err == nil {
				t.Errorf("%s exists, want it deleted", c)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		var got []string
		for _, l := range lines[1:] {
			got = append(got, strings.TrimPrefix(l, "-A "+c.Chain+" "))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s holds\n%s\nwant\n%s", c, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if d, err := f.Check(rs); err != nil || !d.Empty() {
		t.Errorf("Check after Apply: err %v, diff:\n%s", err, d)
	}
	if got := f.IPRules(); !slices.Equal(got, rs.IPRules) {
		t.Errorf("ip rules %v, want %v", got, rs.IPRules)
	}
	if got := f.Routes(); !slices.Equal(got, rs.Routes) {
		t.Errorf("routes %v, want %v", got, rs.Routes)
	}
}

func writes(f *Fake) int { return f.Tables(IPv4).Writes + f.Tables(IPv6).Writes }

func TestFakeApplyConvergesAndIsIdempotent(t *testing.T) {
	f := NewFake()
	rs := mustInPod(t, PodSettings{IPv6: true, DNSCapture: true, ExcludeOutboundPorts: []uint16{9090}})
	if err := f.Apply(rs); err != nil {
		t.Fatal(err)
	}
	assertMatches(t, f, rs)
	before := writes(f)
	if err := f.Apply(rs); err != nil {
		t.Fatal(err)
	}
	if n := writes(f) - before; n != 0 {
		t.Fatalf("re-applying a converged rule set made %d writes, want 0", n)
	}
	assertMatches(t, f, rs)
}

func TestFakeApplyTransitions(t *testing.T) {
	settings := []PodSettings{
		{DNSCapture: true},
		{},                           // DNS off: raw chains must go
		{BypassInboundCapture: true}, // fewer rules
		{IPv6: true, DNSCapture: true, RerouteVirtualInterfaces: []string{"tap0"}, ExcludeOutboundIPRanges: prefixes("10.0.0.0/8")},
		{IPv6: true},
	}
	f := NewFake()
	for _, s := range settings {
		rs := mustInPod(t, s)
		if err := f.Apply(rs); err != nil {
			t.Fatalf("Apply(%+v): %v", s, err)
		}
		assertMatches(t, f, rs)
	}
	chains, _ := f.Tables(IPv4).ListChains("raw")
	if slices.Contains(chains, ChainOutput) || slices.Contains(chains, ChainPrerouting) {
		t.Fatalf("raw chains left after turning DNS off: %v", chains)
	}
}

func TestFakeCheckReportsDriftAndApplyRepairs(t *testing.T) {
	f := NewFake()
	rs := mustInPod(t, PodSettings{DNSCapture: true})
	if err := f.Apply(rs); err != nil {
		t.Fatal(err)
	}
	ipt := f.Tables(IPv4)
	redirect := "! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001"
	stray := "-p tcp -m tcp --dport 2222 -j ACCEPT"
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ipt.Delete("nat", ChainOutput, strings.Fields(redirect)...))
	must(ipt.Append("nat", ChainOutput, strings.Fields(stray)...))
	must(ipt.Insert("nat", "OUTPUT", 1, "-j", ChainOutput)) // duplicate jump
	must(ipt.Delete("raw", "PREROUTING", "-j", ChainPrerouting))
	// reorder: move the probe ACCEPT after the 15006 redirect
	probe := "-s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT"
	must(ipt.Delete("nat", ChainPrerouting, strings.Fields(probe)...))
	must(ipt.Append("nat", ChainPrerouting, strings.Fields(probe)...))
	must(fakeRouting{f}.DelRoute(rs.Routes[0]))

	d, err := f.Check(rs)
	if err != nil {
		t.Fatal(err)
	}
	want := `+ ipv4 -t nat -A ISTIO_OUTPUT ` + redirect + `
+ ipv4 -t raw -A PREROUTING -j ISTIO_PRERT
- ipv4 -t nat -A ISTIO_OUTPUT ` + stray + `
- ipv4 -t nat -A OUTPUT -j ISTIO_OUTPUT
~ ipv4 -t nat ISTIO_PRERT
+ ip -4 route add local 0.0.0.0/0 dev lo table 100
`
	if d.String() != want {
		t.Fatalf("diff:\n%s\nwant:\n%s", d, want)
	}
	if err := f.Apply(rs); err != nil {
		t.Fatal(err)
	}
	assertMatches(t, f, rs)
}

func TestFakeRemoveLeavesForeignRules(t *testing.T) {
	f := NewFake()
	ipt := f.Tables(IPv4)
	if err := ipt.Append("nat", "OUTPUT", "-p", "tcp", "-j", "ACCEPT"); err != nil {
		t.Fatal(err)
	}
	rs := mustInPod(t, PodSettings{IPv6: true, DNSCapture: true})
	if err := f.Apply(rs); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove(rs); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []Family{IPv4, IPv6} {
		for _, table := range tableOrder() {
			chains, _ := f.Tables(fam).ListChains(table)
			if !slices.Equal(chains, builtinChains(table)) {
				t.Errorf("%s %s chains after Remove: %v", fam, table, chains)
			}
			for _, c := range chains {
				lines, _ := f.Tables(fam).List(table, c)
				for _, l := range lines {
					if strings.Contains(l, "ISTIO_") {
						t.Errorf("%s %s: jump left: %s", fam, table, l)
					}
				}
			}
		}
	}
	if lines, _ := ipt.List("nat", "OUTPUT"); !slices.Equal(lines, []string{"-P OUTPUT ACCEPT", "-A OUTPUT -p tcp -j ACCEPT"}) {
		t.Errorf("foreign rule touched: %v", lines)
	}
	if len(f.IPRules())+len(f.Routes()) != 0 {
		t.Errorf("policy routing left: %v %v", f.IPRules(), f.Routes())
	}
	// Removing twice is fine.
	if err := f.Remove(rs); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestApplyRejectsRulesOutsideOwnedChains(t *testing.T) {
	rs := mustInPod(t, PodSettings{})
	rs.Rules = append(rs.Rules, Rule{IPv4, "filter", "INPUT", []string{"-j", "DROP"}})
	if err := NewFake().Apply(rs); err == nil || !strings.Contains(err.Error(), "outside the owned chains") {
		t.Fatalf("Apply = %v, want an ownership error", err)
	}
}

func TestHostProbeApplies(t *testing.T) {
	f := NewFake()
	if err := f.Tables(IPv4).Append("nat", "POSTROUTING", "-j", "MASQUERADE"); err != nil {
		t.Fatal(err)
	}
	rs := HostProbe(false)
	if err := f.Apply(rs); err != nil {
		t.Fatal(err)
	}
	lines, _ := f.Tables(IPv4).List("nat", "POSTROUTING")
	if want := []string{"-P POSTROUTING ACCEPT", "-A POSTROUTING -j ISTIO_POSTRT", "-A POSTROUTING -j MASQUERADE"}; !slices.Equal(lines, want) {
		t.Fatalf("POSTROUTING = %v, want our jump first: %v", lines, want)
	}
	assertMatches(t, f, rs)
}
