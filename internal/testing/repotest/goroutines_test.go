package repotest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// daemonPackages are the daemons' own code: each daemon's main and the run
// wiring it calls, down to the Run that starts its long-lived goroutines.
// In these packages every goroutine is a daemon.Group task (internal/daemon's
// group.go, the skeleton), so that each has a name, its first error stops the
// daemon and is logged once, it stops in a known order, and readiness sees
// it. A `go` statement here is a goroutine outside all of that.
//
// Not daemon code, and so not checked: per-connection and per-request work
// in the data and control paths (proxy/..., hbone, dnsproxy, the xDS and
// ZDS servers' streams, internal/node/inpod's per-pod workers, the
// certificate manager's per-identity refreshers), which lives and dies with
// its connection, stream or object and reports through it; the daemon
// skeleton itself (internal/daemon); and the command-line tools (cmd/zctl,
// cmd/ztunnel-demo), which are not daemons. Tests are not checked.
//
// Each entry is one package directory, not a tree. A listed directory that
// disappears fails the test, so a move cannot silently drop the rule.
var daemonPackages = []string{
	"cmd/ztunnel",
	"cmd/ztunnel-cni",
	"cmd/ztunnel-cp",
	"cmd/waypoint",
	"cni/agent",                       // the node agent's Run
	"cni/agent/bootstrap",             // ztunnel-cni's run wiring
	"internal/controlplane",           // the control plane's Run
	"internal/controlplane/bootstrap", // ztunnel-cp's run wiring
}

// TestNoStrayGoroutines fails on a `go` statement in a daemon package's
// non-test code (see daemonPackages): start the goroutine as a task of the
// daemon's daemon.Group instead.
func TestNoStrayGoroutines(t *testing.T) {
	root := repoRoot(t)
	for _, dir := range daemonPackages {
		files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Errorf("%s: daemon package has no Go files; update daemonPackages", dir)
			continue
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			fset := token.NewFileSet()
			af, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(af, func(n ast.Node) bool {
				if g, ok := n.(*ast.GoStmt); ok {
					p := fset.Position(g.Pos())
					r, _ := filepath.Rel(root, p.Filename)
					t.Errorf("%s:%d: go statement in daemon code; run it as a daemon.Group task (see daemonPackages)", r, p.Line)
				}
				return true
			})
		}
	}
}
