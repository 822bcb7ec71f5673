// Package netnstest creates throwaway named network namespaces and veth links
// for root tests (callers gate on roottest.Require). Names derive from the test
// name, leftovers of an earlier run are deleted first, and t.Cleanup deletes
// everything, so reruns are safe. Nothing is ever added to the root network
// namespace: veth pairs are created directly inside their namespaces.
//
// It is test support only, not a topology builder for e2e tests.
package netnstest

import (
	"crypto/sha256"
	"encoding/hex"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// NS is a named network namespace created for a test.
type NS struct {
	// Name is the name under /var/run/netns (for `ip -n NAME`).
	Name string
	// Handle is open for the test's lifetime; closed in t.Cleanup.
	*netns.Handle
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// Name derives a netns name "zt-<test>-<suffix>" from t.Name(), shortened with
// a hash when long.
func Name(t testing.TB, suffix string) string {
	base := unsafeChars.ReplaceAllString(t.Name(), "_")
	if len(base) > 40 {
		sum := sha256.Sum256([]byte(t.Name()))
		base = base[:31] + "-" + hex.EncodeToString(sum[:4])
	}
	return "zt-" + base + "-" + suffix
}

// New creates the namespace Name(t, suffix) with lo up.
func New(t testing.TB, suffix string) *NS {
	t.Helper()
	name := Name(t, suffix)
	_ = exec.Command("ip", "netns", "del", name).Run() // leftover from an aborted run
	IP(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	h, err := netns.Open("/var/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	IP(t, "-n", name, "link", "set", "lo", "up")
	return &NS{Name: name, Handle: h}
}

// Veth links a and b with a veth pair named ifA (in a) and ifB (in b), both up.
// addrsA and addrsB are CIDRs ("10.0.0.1/24", "fd00::1/64"); IPv6 addresses are
// added with nodad so they are usable at once. The pair dies with the
// namespaces.
func Veth(t testing.TB, a *NS, ifA string, addrsA []string, b *NS, ifB string, addrsB []string) {
	t.Helper()
	IP(t, "link", "add", ifA, "netns", a.Name, "type", "veth", "peer", "name", ifB, "netns", b.Name)
	for _, side := range []struct {
		ns    *NS
		iface string
		addrs []string
	}{{a, ifA, addrsA}, {b, ifB, addrsB}} {
		for _, cidr := range side.addrs {
			args := []string{"-n", side.ns.Name, "addr", "add", cidr, "dev", side.iface}
			if strings.Contains(cidr, ":") {
				args = append(args, "nodad")
			}
			IP(t, args...)
		}
		IP(t, "-n", side.ns.Name, "link", "set", side.iface, "up")
	}
}

// IP runs the ip(8) command and fails the test on error.
func IP(t testing.TB, args ...string) {
	t.Helper()
	Run(t, "ip", args...)
}

// Run runs a command and fails the test on error; it returns stdout.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// Exec runs a command inside ns (ip netns exec) and fails the test on error;
// it returns stdout.
func (ns *NS) Exec(t testing.TB, name string, args ...string) string {
	t.Helper()
	return Run(t, "ip", append([]string{"netns", "exec", ns.Name, name}, args...)...)
}
