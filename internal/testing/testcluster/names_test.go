package testcluster

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"
)

func TestClusterID(t *testing.T) {
	valid := regexp.MustCompile(`^[A-Za-z0-9-]+-[0-9a-f]{6}$`)
	for _, tc := range []struct{ dir, test, name, wantPrefix string }{
		{"/repo/e2e", "TestDirect", "", "TestDirect-"},
		{"/repo/e2e", "TestMatrix/client=captured/server=plain", "", "TestMatrix-client-captur"},
		{"/repo/e2e", "TestX/#00", "", "TestX-00-"},
		{"/repo/e2e", "Test_weird..name__", "", "Test-weird-name-"},
		{"/repo/e2e", "///", "", "t-"},
	} {
		id := clusterID(tc.dir, tc.test, tc.name)
		if !valid.MatchString(id) || !strings.HasPrefix(id, tc.wantPrefix) || len(id) > slugLen+7 {
			t.Errorf("clusterID(%q) = %q, want prefix %q, [A-Za-z0-9-], ≤ %d bytes", tc.test, id, tc.wantPrefix, slugLen+7)
		}
		if again := clusterID(tc.dir, tc.test, tc.name); again != id {
			t.Errorf("clusterID(%q) not stable: %q then %q", tc.test, id, again)
		}
	}
	// Same test name in another package, a different cluster name, or a test
	// whose name only differs past the slug: all distinct.
	base := clusterID("/repo/e2e", "TestDirect", "")
	for _, other := range []string{
		clusterID("/repo/internal/cni", "TestDirect", ""),
		clusterID("/repo/e2e", "TestDirect", "west"),
		clusterID("/repo/e2e", "TestDirect/sub", ""),
	} {
		if other == base {
			t.Errorf("clusterID collision: %q", other)
		}
	}
	long1 := clusterID("/d", "TestAVeryLongNameThatGoesOn/case_one", "")
	long2 := clusterID("/d", "TestAVeryLongNameThatGoesOn/case_two", "")
	if long1 == long2 {
		t.Errorf("names differing after the slug collide: %q", long1)
	}
	// No namespace prefix is a prefix of another cluster's (so leftover
	// deletion never touches a neighbour): ids end in a fixed-width hash.
	if strings.HasPrefix(nsPrefix(long1), nsPrefix(long2)) || strings.HasPrefix(nsPrefix(long2), nsPrefix(long1)) {
		t.Errorf("prefixes %q and %q overlap", nsPrefix(long1), nsPrefix(long2))
	}
}

func TestNamespaceNames(t *testing.T) {
	id := "TestX-abcdef"
	for got, want := range map[string]string{
		underlayNS(id):   "zt-TestX-abcdef-ul",
		nodeNS(id, 3):    "zt-TestX-abcdef-n3",
		podNS(id, 1, 12): "zt-TestX-abcdef-n1-p12",
		nodeName(2):      "node2",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

func TestAddressPlan(t *testing.T) {
	ul, pods, svcs := netip.MustParsePrefix(UnderlayCIDR), netip.MustParsePrefix(PodCIDRs), netip.MustParsePrefix(ServiceCIDR)
	for _, tc := range []struct {
		got, want netip.Addr
		in        netip.Prefix
	}{
		{underlayIP(0), netip.MustParseAddr("10.30.0.10"), ul},
		{underlayIP(MaxNodes - 1), netip.MustParseAddr("10.30.0.209"), ul},
		{podGateway(1), netip.MustParseAddr("10.31.1.1"), pods},
		{podIP(1, 0), netip.MustParseAddr("10.31.1.10"), podCIDR(1)},
		{podIP(MaxNodes-1, MaxPodsPerNode-1), netip.MustParseAddr("10.31.199.249"), podCIDR(MaxNodes - 1)},
		{serviceIP(0), netip.MustParseAddr("10.32.0.10"), svcs},
		{serviceIP(300), netip.MustParseAddr("10.32.1.54"), svcs},
	} {
		if tc.got != tc.want || !tc.in.Contains(tc.got) {
			t.Errorf("got %s, want %s in %s", tc.got, tc.want, tc.in)
		}
	}
	if podCIDR(2) != netip.MustParsePrefix("10.31.2.0/24") {
		t.Errorf("podCIDR(2) = %s", podCIDR(2))
	}
	// This machine's network must stay outside every range (see the const
	// comment); a change of plan that breaks this should be deliberate.
	for _, r := range []netip.Prefix{ul, pods, svcs} {
		for _, real := range []string{"192.0.2.0/24", "172.17.0.0/16", "10.244.0.0/16", "10.96.0.0/12"} {
			if r.Overlaps(netip.MustParsePrefix(real)) {
				t.Errorf("%s overlaps %s", r, real)
			}
		}
	}
}

func TestUID(t *testing.T) {
	a := uid("c", "Pod", "ns", "a")
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(a) {
		t.Errorf("uid %q is not UUID-shaped", a)
	}
	if a != uid("c", "Pod", "ns", "a") || a == uid("c", "Pod", "ns", "b") || a == uid("d", "Pod", "ns", "a") ||
		uid("c", "Pod", "a", "b") == uid("c", "Pod", "ab", "") {
		t.Error("uid is not a stable function of cluster, kind, namespace and name")
	}
}
