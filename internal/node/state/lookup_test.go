package state

import (
	"fmt"
	"net/netip"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// cidrSvc is a ServiceEntry-like service host.example in ns whose VIPs are
// the given addresses or CIDRs ("10.0.0.0/8", "fd00::/16", "10.1.2.3").
func cidrSvc(ns, host string, vips []string, opts ...sopt) *workloadapi.Address {
	s := &workloadapi.Service{Name: host, Namespace: ns, Hostname: host}
	for _, v := range vips {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			a := netip.MustParseAddr(v)
			s.Addresses = append(s.Addresses, &workloadapi.NetworkAddress{Address: a.AsSlice()})
			continue
		}
		s.Addresses = append(s.Addresses, &workloadapi.NetworkAddress{Address: p.Addr().AsSlice(), Length: new(uint32(p.Bits()))})
	}
	for _, o := range opts {
		o(s)
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}
}

func canonical() sopt { return func(s *workloadapi.Service) { s.Canonical = true } }

func onNetwork(n string) sopt {
	return func(s *workloadapi.Service) {
		for _, a := range s.Addresses {
			a.Network = n
		}
	}
}

// TestServiceByVIPPrefixes is the route table for CIDR VIPs: exact VIPs
// beat prefixes, the longest prefix wins, IPv4 and IPv6 do not mix,
// networks are separate, and upstream ztunnel's ranking (client namespace,
// then length, then canonical, then key) picks among overlaps.
func TestServiceByVIPPrefixes(t *testing.T) {
	s := NewStore()
	mustApply(t, s,
		cidrSvc("egress", "wide.example", []string{"10.0.0.0/8", "fd00::/16"}),
		cidrSvc("egress", "mid.example", []string{"10.20.0.0/16"}),
		cidrSvc("egress", "narrow.example", []string{"10.20.30.0/24", "fd00:1:2::/48"}),
		cidrSvc("egress", "exact.example", []string{"10.20.30.40", "fd00:1:2::40"}),
		// Same /16 in two more namespaces: canonical beats the smaller key,
		// the client's namespace beats both (and a longer prefix elsewhere).
		cidrSvc("team-a", "a.example", []string{"10.20.0.0/16"}),
		cidrSvc("team-b", "b.example", []string{"10.20.0.0/16"}, canonical()),
		cidrSvc("team-c", "c.example", []string{"10.0.0.0/8"}),
		cidrSvc("egress", "other-net.example", []string{"10.20.30.0/25"}, onNetwork("net2")),
		// A whole-family default route and a /0 of IPv6.
		cidrSvc("egress", "any4.example", []string{"0.0.0.0/0"}),
	)
	snap := s.Load()
	for _, tc := range []struct {
		network, ip, ns string
		want            string // hostname; "" = none
	}{
		{"", "10.20.30.40", "", "exact.example"},         // exact beats every prefix
		{"", "10.20.30.41", "", "narrow.example"},        // /24 over /16 and /8
		{"", "10.20.31.1", "", "b.example"},              // /16: canonical b over egress/mid and team-a
		{"", "10.21.0.1", "", "wide.example"},            // /8: egress/wide and team-c/c tie; neither canonical: smallest key
		{"", "10.21.0.1", "team-c", "c.example"},         // the client's namespace
		{"", "10.20.30.41", "team-c", "c.example"},       // a /8 of the client's namespace beats a /24 elsewhere
		{"", "10.20.30.41", "team-a", "a.example"},       // ...and so does a /16
		{"", "10.20.30.41", "nobody", "narrow.example"},  // no service in the namespace: longest
		{"", "10.20.30.40", "team-a", "exact.example"},   // exact still first
		{"", "11.0.0.1", "", "any4.example"},             // /0
		{"net2", "10.20.30.1", "", "other-net.example"},  // its own network only
		{"net2", "10.20.30.200", "", ""},                 // outside the /25, nothing else on net2
		{"", "fd00:1:2::41", "", "narrow.example"},       // IPv6 /48 over /16
		{"", "fd00:1:2::40", "", "exact.example"},        // IPv6 exact
		{"", "fd00:9::1", "", "wide.example"},            // IPv6 /16
		{"", "fe80::1", "", ""},                          // the IPv4 /0 does not match IPv6
		{"", "::ffff:10.20.30.41", "", "narrow.example"}, // 4-in-6 is IPv4
	} {
		got := snap.ServiceByVIP(tc.network, netip.MustParseAddr(tc.ip), tc.ns)
		gotHost := ""
		if got != nil {
			gotHost = got.Hostname
		}
		if gotHost != tc.want {
			t.Errorf("ServiceByVIP(%q, %s, ns %q) = %q, want %q", tc.network, tc.ip, tc.ns, gotHost, tc.want)
		}
	}

	// The table follows updates: narrowing mid to a /24 of its own,
	// removing narrow, and dropping the /0.
	if err := s.ApplyAddresses(addrs(cidrSvc("egress", "mid.example", []string{"10.20.31.0/24"})),
		[]string{"egress/narrow.example", "egress/any4.example"}); err != nil {
		t.Fatal(err)
	}
	snap2 := s.Load()
	for ip, want := range map[string]string{"10.20.30.41": "b.example", "10.20.31.1": "mid.example", "11.0.0.1": ""} {
		got := snap2.ServiceByVIP("", netip.MustParseAddr(ip), "")
		if (got == nil) != (want == "") || got != nil && got.Hostname != want {
			t.Errorf("after update: ServiceByVIP(%s) = %v, want %q", ip, got, want)
		}
	}
	// The old snapshot is unchanged.
	if got := snap.ServiceByVIP("", netip.MustParseAddr("10.20.30.41"), ""); got == nil || got.Hostname != "narrow.example" {
		t.Errorf("old snapshot changed: %v", got)
	}
	// A snapshot that did not touch CIDR services shares the table.
	mustApply(t, s, svc("ns", "plain", "10.96.0.9", 80, 8080))
	if snap3 := s.Load(); &snap3.servicePfx.entries[0] != &snap2.servicePfx.entries[0] {
		t.Errorf("the prefix table was rebuilt for a change without CIDR VIPs")
	}

	if n := testing.AllocsPerRun(100, func() {
		snap.ServiceByVIP("", netip.MustParseAddr("10.20.30.41"), "nobody")
		snap.ServiceByVIP("", netip.MustParseAddr("fd00:9::1"), "egress")
	}); n != 0 {
		t.Errorf("CIDR lookups allocate %v times", n)
	}
}

// TestServiceByVIPCanonical: among services sharing an exact VIP, the
// client's namespace wins, then a canonical one, then the smallest key.
func TestServiceByVIPCanonical(t *testing.T) {
	s := NewStore()
	mustApply(t, s,
		cidrSvc("a", "shared.example", []string{"10.9.0.1"}),
		cidrSvc("b", "shared.example", []string{"10.9.0.1"}, canonical()),
		cidrSvc("c", "shared.example", []string{"10.9.0.1"}),
	)
	snap := s.Load()
	for ns, want := range map[string]string{"": "b", "c": "c", "a": "a", "z": "b"} {
		if got := snap.ServiceByVIP("", ip("10.9.0.1"), ns); got == nil || got.Namespace != want {
			t.Errorf("ServiceByVIP(ns %q) = %v, want namespace %s", ns, got, want)
		}
	}
	mustApply(t, s, cidrSvc("b", "shared.example", []string{"10.9.0.1"}))
	if got := s.Load().ServiceByVIP("", ip("10.9.0.1"), ""); got == nil || got.Namespace != "a" {
		t.Errorf("without canonical: %v, want the smallest key (namespace a)", got)
	}
}

// BenchmarkServiceByVIPCIDR: a miss on the exact VIPs and a
// longest-prefix match among 1,000 CIDR services of 8 lengths.
func BenchmarkServiceByVIPCIDR(b *testing.B) {
	s := NewStore()
	var as []*workloadapi.Address
	for i := range 1000 {
		bits := 16 + (i%8)*2
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i / 4), byte(i%4) * 64, 0}), bits).Masked()
		as = append(as, cidrSvc(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("h%d.example", i), []string{p.String()}))
	}
	mustApply(b, s, as...)
	snap := s.Load()
	dst := netip.MustParseAddr("10.100.70.5")
	if snap.ServiceByVIP("", dst, "ns3") == nil {
		b.Fatal("no match")
	}
	b.ReportAllocs()
	for b.Loop() {
		snap.ServiceByVIP("", dst, "ns3")
	}
}

// TestServiceByVIPVisibility: a service visible to its own namespace only
// is skipped for clients of other namespaces (exact VIPs and CIDRs alike),
// the next candidate is taken instead, and an unknown client ("") sees it.
// A length equal to the address size is a single IP (an exact VIP).
func TestServiceByVIPVisibility(t *testing.T) {
	private := func(s *workloadapi.Service) { s.Visibility = workloadapi.Service_NAMESPACE }
	s := NewStore()
	mustApply(t, s,
		cidrSvc("a", "private.example", []string{"10.9.0.1", "10.8.0.0/24"}, private, canonical()),
		cidrSvc("b", "public.example", []string{"10.8.0.0/16"}),
		cidrSvc("c", "slash32.example", []string{"10.7.0.1/32"}),
	)
	snap := s.Load()
	for _, tc := range []struct{ ip, ns, want string }{
		{"10.9.0.1", "a", "a/private.example"},
		{"10.9.0.1", "", "a/private.example"},
		{"10.9.0.1", "z", ""},                  // hidden; no CIDR covers it
		{"10.8.0.5", "a", "a/private.example"}, // its own namespace
		{"10.8.0.5", "", "a/private.example"},  // longest
		{"10.8.0.5", "z", "b/public.example"},  // the private /24 is skipped
		{"10.7.0.1", "z", "c/slash32.example"},
	} {
		if got := keyOf(snap.ServiceByVIP("", ip(tc.ip), tc.ns)); got != tc.want {
			t.Errorf("ServiceByVIP(%s, ns %q) = %q, want %q", tc.ip, tc.ns, got, tc.want)
		}
	}
	if n := len(snap.servicePfx.entries); n != 2 {
		t.Errorf("%d CIDR entries, want 2 (a /32 is an exact VIP)", n)
	}
}

func keyOf(s *Service) string {
	if s == nil {
		return ""
	}
	return s.Key
}

// TestServiceByVIPRangeSkipsOwned: a range never answers for an address a
// workload holds (host-network ones too: node addresses), nor for a
// service's exact VIP, also one hidden from the asking namespace; removing
// the owner hands the address back to the range.
func TestServiceByVIPRangeSkipsOwned(t *testing.T) {
	s := NewStore()
	hostNet := func(w *workloadapi.Workload) { w.NetworkMode = workloadapi.NetworkMode_HOST_NETWORK }
	private := func(s *workloadapi.Service) { s.Visibility = workloadapi.Service_NAMESPACE }
	mustApply(t, s,
		cidrSvc("evil", "all.example", []string{"0.0.0.0/0"}),
		pod("victim", "web-0", "10.0.0.2"),
		pod("kube-system", "node-agent", "172.18.0.2", hostNet),
		pod("kube-system", "node-exporter", "172.18.0.2", hostNet),
		svcOpts("victim", "db", "10.96.0.11", []uint32{5432, 5432}, private),
	)
	snap := s.Load()
	for _, tc := range []struct{ ip, ns, want string }{
		{"10.0.0.2", "", ""},
		{"10.0.0.2", "evil", ""},
		{"172.18.0.2", "evil", ""},
		{"10.96.0.11", "evil", ""}, // hidden from evil, still not evil's range
		{"10.96.0.11", "victim", "db.victim.svc.cluster.local"},
		{"10.0.0.99", "evil", "all.example"},
	} {
		got := ""
		if svc := snap.ServiceByVIP("", ip(tc.ip), tc.ns); svc != nil {
			got = svc.Hostname
		}
		if got != tc.want {
			t.Errorf("ServiceByVIP(%s) from %q = %q, want %q", tc.ip, tc.ns, got, tc.want)
		}
	}
	// One host-network workload leaving keeps the node address owned; the
	// last one leaving frees it.
	if err := s.ApplyAddresses(nil, []string{uid("kube-system", "node-agent")}); err != nil {
		t.Fatal(err)
	}
	if svc := s.Load().ServiceByVIP("", ip("172.18.0.2"), "evil"); svc != nil {
		t.Errorf("node address taken by %s while a host-network workload still has it", svc.Key)
	}
	if err := s.ApplyAddresses(nil, []string{uid("kube-system", "node-exporter"), uid("victim", "web-0")}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"172.18.0.2", "10.0.0.2"} {
		if svc := s.Load().ServiceByVIP("", ip(a), "evil"); svc == nil || svc.Hostname != "all.example" {
			t.Errorf("%s after its owners left: %v, want the range", a, svc)
		}
	}
}

// TestServiceExportToExtension: a NAMESPACE service widened by the
// export-to extension is seen by the namespaces it lists and its own, by
// no other; a malformed extension is refused, not read as PUBLIC.
func TestServiceExportToExtension(t *testing.T) {
	cfg, err := anypb.New(wrapperspb.String("team-b,team-c"))
	if err != nil {
		t.Fatal(err)
	}
	shared := func(s *workloadapi.Service) {
		s.Visibility = workloadapi.Service_NAMESPACE
		s.Extensions = append(s.Extensions, &workloadapi.Extension{Name: ExportToExtension, Config: cfg})
	}
	s := NewStore()
	mustApply(t, s, svcOpts("team-a", "web", "10.96.0.1", []uint32{80, 80}, shared))
	snap := s.Load()
	for ns, want := range map[string]bool{"team-a": true, "team-b": true, "team-c": true, "team-d": false, "": true} {
		if got := snap.ServiceByVIP("", ip("10.96.0.1"), ns) != nil; got != want {
			t.Errorf("visible to %q: %v, want %v", ns, got, want)
		}
	}
	bad := func(s *workloadapi.Service) {
		s.Visibility = workloadapi.Service_NAMESPACE
		s.Extensions = append(s.Extensions, &workloadapi.Extension{Name: ExportToExtension})
	}
	if err := s.ApplyAddresses(addrs(svcOpts("team-a", "api", "10.96.0.2", []uint32{80, 80}, bad)), nil); err == nil {
		t.Error("export-to extension without config accepted")
	}
}

// TestServiceGlobalScopeExtension: only a service carrying the global-scope
// extension is Global; without it (Istio's own control plane, or a local
// service) it is not.
func TestServiceGlobalScopeExtension(t *testing.T) {
	s := NewStore()
	global := func(s *workloadapi.Service) {
		s.Extensions = append(s.Extensions, &workloadapi.Extension{Name: GlobalScopeExtension})
	}
	mustApply(t, s, svcOpts("team-a", "web", "10.96.0.1", []uint32{80, 80}, global))
	mustApply(t, s, svcOpts("team-a", "api", "10.96.0.2", []uint32{80, 80}))
	snap := s.Load()
	if svc := snap.ServiceByVIP("", ip("10.96.0.1"), ""); svc == nil || !svc.Global {
		t.Errorf("web: %+v, want Global", svc)
	}
	if svc := snap.ServiceByVIP("", ip("10.96.0.2"), ""); svc == nil || svc.Global {
		t.Errorf("api: %+v, want not Global", svc)
	}
}

// TestKnownCluster: a cluster is known while some workload of it is in
// the state, and forgotten with its last one; an empty id never is.
func TestKnownCluster(t *testing.T) {
	s := NewStore()
	mustApply(t, s, pod("ns", "a", "10.0.0.1", cluster("east")), pod("ns", "b", "10.0.0.2", cluster("west")),
		pod("ns", "c", "10.0.0.3", cluster("west")))
	snap := s.Load()
	for id, want := range map[string]bool{"east": true, "west": true, "north": false, "": false} {
		if got := snap.KnownCluster(id); got != want {
			t.Errorf("KnownCluster(%q) = %v, want %v", id, got, want)
		}
	}
	if err := s.ApplyAddresses(nil, []string{uid("ns", "b")}); err != nil {
		t.Fatal(err)
	}
	if !s.Load().KnownCluster("west") {
		t.Error("west forgotten while c is still there")
	}
	// c moves to another cluster: west goes, the old snapshot keeps it.
	mustApply(t, s, pod("ns", "c", "10.0.0.3", cluster("north")))
	if next := s.Load(); next.KnownCluster("west") || !next.KnownCluster("north") || !snap.KnownCluster("west") {
		t.Errorf("after the move: west %v north %v, old snapshot west %v; want false, true, true",
			next.KnownCluster("west"), next.KnownCluster("north"), snap.KnownCluster("west"))
	}
}
