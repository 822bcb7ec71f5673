package dnsproxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

const clientNS = "client-ns"

// meshState is the state every resolve test case queries, as WDS sends it.
func meshState(t testing.TB) *state.Store {
	return newStore(t,
		podAddr(clientNS, "client", []string{"10.1.0.1"}),
		podAddr("net2-ns", "remote-client", []string{"10.1.0.1"}, onNetwork("net2")),

		// Kubernetes services.
		svcAddr(clientNS, "echo.client-ns.svc.cluster.local", []string{"10.96.0.10", "fd00::10", "net2/10.200.0.10"}, families(workloadapi.IPFamilies_DUAL)),
		svcAddr("other", "db.other.svc.cluster.local", []string{"10.96.0.20"}, families(workloadapi.IPFamilies_IPV4_ONLY)),
		svcAddr("other", "v6only.other.svc.cluster.local", []string{"fd00::30"}, families(workloadapi.IPFamilies_IPV6_ONLY)),
		svcAddr(clientNS, "v4.client-ns.svc.cluster.local", []string{"10.96.0.40"}),
		svcAddr(clientNS, "headless.client-ns.svc.cluster.local", nil),
		podAddr(clientNS, "hl-a", []string{"10.1.0.5", "fd01::5"}, endpointOf(clientNS+"/headless.client-ns.svc.cluster.local")),
		podAddr(clientNS, "hl-b", []string{"10.1.0.6"}, endpointOf(clientNS+"/headless.client-ns.svc.cluster.local")),
		podAddr(clientNS, "hl-c", []string{"10.1.0.7"}, endpointOf(clientNS+"/headless.client-ns.svc.cluster.local"), unhealthy()),

		// ServiceEntries: auto-allocated addresses (240.240/16, 2001:2::/48),
		// a wildcard host, one without addresses.
		svcAddr("se-ns", "api.example.com", []string{"240.240.0.1", "2001:2::1"}),
		svcAddr("se-ns", "*.wild.example.com", []string{"240.240.0.2"}),
		svcAddr("se-ns", "noaddr.example.com", nil),

		// ExternalName aliases.
		svcAddr(clientNS, "alias.client-ns.svc.cluster.local", nil, aliasOf(t, "db.other.svc.cluster.local")),
		svcAddr(clientNS, "alias-se.client-ns.svc.cluster.local", nil, aliasOf(t, "api.example.com")),
		svcAddr(clientNS, "dangling.client-ns.svc.cluster.local", nil, aliasOf(t, "gone.other.svc.cluster.local")),
		svcAddr(clientNS, "loop1.client-ns.svc.cluster.local", nil, aliasOf(t, "loop2.client-ns.svc.cluster.local")),
		svcAddr(clientNS, "loop2.client-ns.svc.cluster.local", nil, aliasOf(t, "loop1.client-ns.svc.cluster.local")),

		// One hostname in several namespaces.
		svcAddr("a", "shared.example.com", []string{"240.240.1.1"}),
		svcAddr(clientNS, "shared.example.com", []string{"240.240.1.2"}),
		svcAddr("a", "shared2.example.com", []string{"240.240.2.1"}),
		svcAddr("b", "shared2.example.com", []string{"240.240.2.2"}, canonical()),
		svcAddr("x", "shared3.example.com", []string{"240.240.3.1"}),
		svcAddr("y", "shared3.example.com", []string{"240.240.3.2"}),
		svcAddr("a", "private.example.com", []string{"240.240.4.1"}, namespaceVisible()),
	)
}

func TestResolve(t *testing.T) {
	st := meshState(t)
	snap := st.Load()
	client := snap.WorkloadByUID("Kubernetes//Pod/" + clientNS + "/client")
	remote := snap.WorkloadByUID("Kubernetes//Pod/net2-ns/remote-client")
	if client == nil || remote == nil {
		t.Fatal("client workloads missing from state")
	}
	A, AAAA := dns.TypeA, dns.TypeAAAA
	// want is "forward", or the answer as
	// "[cname a>b; ...] owner=<name> addrs=<sorted,ips> [family-not-allowed] svc=<key>".
	tests := []struct {
		name     string
		qname    string
		qtype    uint16
		resolver Resolver
		client   *state.Workload
		want     string
	}{
		{name: "short name in own namespace", qname: "echo.", qtype: A,
			want: "owner=echo. addrs=10.96.0.10 svc=client-ns/echo.client-ns.svc.cluster.local"},
		{name: "namespaced", qname: "db.other.", qtype: A,
			want: "owner=db.other. addrs=10.96.0.20 svc=other/db.other.svc.cluster.local"},
		{name: "namespaced with svc", qname: "db.other.svc.", qtype: A,
			want: "owner=db.other.svc. addrs=10.96.0.20 svc=other/db.other.svc.cluster.local"},
		{name: "FQDN AAAA", qname: "echo.client-ns.svc.cluster.local.", qtype: AAAA,
			want: "owner=echo.client-ns.svc.cluster.local. addrs=fd00::10 svc=client-ns/echo.client-ns.svc.cluster.local"},
		{name: "FQDN without trailing dot, mixed case", qname: "ECHO.Client-NS.svc.cluster.local", qtype: A,
			want: "owner=ECHO.Client-NS.svc.cluster.local. addrs=10.96.0.10 svc=client-ns/echo.client-ns.svc.cluster.local"},
		{name: "VIP on another network is not answered", qname: "echo.client-ns.svc.cluster.local.", qtype: A, client: remote,
			want: "owner=echo.client-ns.svc.cluster.local. addrs=10.200.0.10 svc=client-ns/echo.client-ns.svc.cluster.local"},
		{name: "search-stripped ServiceEntry host gets a CNAME", qname: "api.example.com.client-ns.svc.cluster.local.", qtype: A,
			want: "cname api.example.com.client-ns.svc.cluster.local.>api.example.com.; owner=api.example.com. addrs=240.240.0.1 svc=se-ns/api.example.com"},
		{name: "search-stripped by svc.cluster.local", qname: "api.example.com.svc.cluster.local.", qtype: AAAA,
			want: "cname api.example.com.svc.cluster.local.>api.example.com.; owner=api.example.com. addrs=2001:2::1 svc=se-ns/api.example.com"},
		{name: "search-stripped then Kubernetes-expanded", qname: "db.other.client-ns.svc.cluster.local.", qtype: A,
			want: "cname db.other.client-ns.svc.cluster.local.>db.other.; owner=db.other. addrs=10.96.0.20 svc=other/db.other.svc.cluster.local"},
		{name: "ServiceEntry with auto-allocated address", qname: "api.example.com.", qtype: A,
			want: "owner=api.example.com. addrs=240.240.0.1 svc=se-ns/api.example.com"},
		{name: "ServiceEntry auto-allocated IPv6", qname: "api.example.com.", qtype: AAAA,
			want: "owner=api.example.com. addrs=2001:2::1 svc=se-ns/api.example.com"},
		{name: "ServiceEntry without address is forwarded", qname: "noaddr.example.com.", qtype: A, want: "forward"},
		{name: "wildcard host", qname: "foo.wild.example.com.", qtype: A,
			want: "owner=foo.wild.example.com. addrs=240.240.0.2 svc=se-ns/*.wild.example.com"},
		{name: "wildcard deeper", qname: "a.b.wild.example.com.", qtype: A,
			want: "owner=a.b.wild.example.com. addrs=240.240.0.2 svc=se-ns/*.wild.example.com"},
		{name: "wildcard through a search domain: no CNAME", qname: "foo.wild.example.com.client-ns.svc.cluster.local.", qtype: A,
			want: "owner=foo.wild.example.com.client-ns.svc.cluster.local. addrs=240.240.0.2 svc=se-ns/*.wild.example.com"},
		{name: "wildcard does not match its own base", qname: "wild.example.com.", qtype: A, want: "forward"},
		{name: "headless: healthy endpoints", qname: "headless.", qtype: A,
			want: "owner=headless. addrs=10.1.0.5,10.1.0.6 svc=client-ns/headless.client-ns.svc.cluster.local"},
		{name: "headless AAAA: one per endpoint with v6", qname: "headless.client-ns.svc.cluster.local.", qtype: AAAA,
			want: "owner=headless.client-ns.svc.cluster.local. addrs=fd01::5 svc=client-ns/headless.client-ns.svc.cluster.local"},
		{name: "family not allowed: IPv4-only service", qname: "db.other.", qtype: AAAA,
			want: "owner=db.other. addrs= family-not-allowed svc=other/db.other.svc.cluster.local"},
		{name: "family not allowed: IPv6-only service", qname: "v6only.other.", qtype: A,
			want: "owner=v6only.other. addrs= family-not-allowed svc=other/v6only.other.svc.cluster.local"},
		{name: "family not allowed: IPv6 disabled", qname: "echo.", qtype: AAAA, resolver: Resolver{DisableIPv6: true},
			want: "owner=echo. addrs= family-not-allowed svc=client-ns/echo.client-ns.svc.cluster.local"},
		{name: "found without records of the family", qname: "v4.", qtype: AAAA,
			want: "owner=v4. addrs= svc=client-ns/v4.client-ns.svc.cluster.local"},
		{name: "ExternalName alias", qname: "alias.", qtype: A,
			want: "cname alias.>db.other.svc.cluster.local.; owner=db.other.svc.cluster.local. addrs=10.96.0.20 svc=other/db.other.svc.cluster.local"},
		{name: "ExternalName alias, search-stripped", qname: "alias.client-ns.svc.cluster.local.svc.cluster.local.", qtype: A,
			want: "cname alias.client-ns.svc.cluster.local.svc.cluster.local.>alias.client-ns.svc.cluster.local.; " +
				"cname alias.client-ns.svc.cluster.local.>db.other.svc.cluster.local.; owner=db.other.svc.cluster.local. addrs=10.96.0.20 svc=other/db.other.svc.cluster.local"},
		{name: "ExternalName alias of a ServiceEntry host", qname: "alias-se.client-ns.svc.cluster.local.", qtype: A,
			want: "cname alias-se.client-ns.svc.cluster.local.>api.example.com.; owner=api.example.com. addrs=240.240.0.1 svc=se-ns/api.example.com"},
		{name: "ExternalName alias, target family not allowed", qname: "alias.", qtype: AAAA,
			want: "cname alias.>db.other.svc.cluster.local.; owner=db.other.svc.cluster.local. addrs= family-not-allowed svc=other/db.other.svc.cluster.local"},
		{name: "ExternalName alias to an unknown name is forwarded", qname: "dangling.", qtype: A, want: "forward"},
		{name: "ExternalName alias loop is forwarded", qname: "loop1.", qtype: A, want: "forward"},
		{name: "same-namespace service wins", qname: "shared.example.com.", qtype: A,
			want: "owner=shared.example.com. addrs=240.240.1.2 svc=client-ns/shared.example.com"},
		{name: "canonical service wins", qname: "shared2.example.com.", qtype: A,
			want: "owner=shared2.example.com. addrs=240.240.2.2 svc=b/shared2.example.com"},
		{name: "first service by key", qname: "shared3.example.com.", qtype: A,
			want: "owner=shared3.example.com. addrs=240.240.3.1 svc=x/shared3.example.com"},
		{name: "preferred namespace", qname: "shared3.example.com.", qtype: A, resolver: Resolver{PreferredNamespace: "y"},
			want: "owner=shared3.example.com. addrs=240.240.3.2 svc=y/shared3.example.com"},
		{name: "namespace-visible service of another namespace", qname: "private.example.com.", qtype: A, want: "forward"},
		{name: "unknown name", qname: "www.example.org.", qtype: A, want: "forward"},
		{name: "short unknown name", qname: "nothing.", qtype: A, want: "forward"},
		{name: "other type", qname: "echo.", qtype: dns.TypeMX, want: "forward"},
		{name: "escaped label", qname: `ec\.ho.`, qtype: A, want: "forward"},
		{name: "root", qname: ".", qtype: A, want: "forward"},
		{name: "custom cluster domain", qname: "echo.client-ns.svc.cluster.local.", qtype: A, resolver: Resolver{Domain: "corp.example"},
			want: "owner=echo.client-ns.svc.cluster.local. addrs=10.96.0.10 svc=client-ns/echo.client-ns.svc.cluster.local"},
		{name: "custom cluster domain: no expansion to cluster.local", qname: "echo.", qtype: A, resolver: Resolver{Domain: "corp.example"}, want: "forward"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := client
			if tc.client != nil {
				c = tc.client
			}
			got := describe(tc.resolver.Resolve(snap, c, tc.qname, tc.qtype))
			if got != tc.want {
				t.Errorf("Resolve(%q, %s)\n got %s\nwant %s", tc.qname, dns.TypeToString[tc.qtype], got, tc.want)
			}
		})
	}
	t.Run("nil client", func(t *testing.T) {
		if got := describe((&Resolver{}).Resolve(snap, nil, "echo.", A)); got != "forward" {
			t.Errorf("got %s, want forward", got)
		}
	})
}

func describe(a Answer) string {
	if !a.Found {
		return "forward"
	}
	var b strings.Builder
	for _, c := range a.CNAMEs {
		fmt.Fprintf(&b, "cname %s>%s; ", c.Name, c.Target)
	}
	addrs := slices.Clone(a.Addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	s := make([]string, len(addrs))
	for i, ip := range addrs {
		s[i] = ip.String()
	}
	fmt.Fprintf(&b, "owner=%s addrs=%s", a.Owner, strings.Join(s, ","))
	if a.FamilyNotAllowed {
		b.WriteString(" family-not-allowed")
	}
	fmt.Fprintf(&b, " svc=%s", a.Service.Key)
	return b.String()
}
