// Package roottest gates tests that need root privileges and network
// namespaces. It is not a fake: tests that call Require run against the real
// kernel (ip netns, veth, iptables) and only ever inside namespaces they create.
package roottest

import (
	"os"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// EnvRequireRoot names the environment variable that turns a missing root
// privilege from a skip into a failure. `make test` (and so CI) sets it, so a
// root-only test can never be silently skipped there.
const EnvRequireRoot = "ZTG_REQUIRE_ROOT"

// Require skips t when the process is not root, or fails it when
// ZTG_REQUIRE_ROOT=1 is set.
// Under `go test -short` it always skips, root or not: the fast loop makes no
// namespaces and changes no firewall.
func Require(t testing.TB) {
	t.Helper()
	testkit.SkipShort(t, "root and network namespaces")
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv(EnvRequireRoot) == "1" {
		t.Fatalf("test needs root (network namespaces, iptables) and %s=1 is set", EnvRequireRoot)
	}
	t.Skip("test needs root (network namespaces, iptables); run as root or via `make test`")
}
