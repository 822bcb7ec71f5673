package repotest

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// update rewrites the committed per-binary dependency lists:
//
//	go test ./internal/testing/repotest -run TestBinaryDeps -update
var update = flag.Bool("update", false, "rewrite cmd/<binary>/deps.txt from the current build")

const module = "github.com/ztunnel-go/ztunnel-go"

// pkgInfo is what `go list -deps -json` tells about one package.
type pkgInfo struct {
	ImportPath string
	Standard   bool
	Imports    []string
	Module     *struct{ Path string }
}

var (
	listOnce sync.Once
	listed   map[string]*pkgInfo // every non-test package of the module and its deps
	listErr  error
)

// goList lists ./... with all dependencies, once per test binary. Only
// non-test imports count: these rules are about what ships in a binary;
// tests may use any package as a fixture (a real CA to mint certificates, a
// test cluster).
func goList(t *testing.T) map[string]*pkgInfo {
	t.Helper()
	listOnce.Do(func() {
		// With the tags the binaries are built with (TestBuildTagsAgree).
		cmd := exec.Command("go", "list", "-deps", "-tags", testkit.BuildTags, "-json=ImportPath,Standard,Imports,Module", "./...")
		cmd.Dir = repoRoot(t)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			listErr = fmt.Errorf("go list: %w", err)
			return
		}
		listed = map[string]*pkgInfo{}
		dec := json.NewDecoder(bytes.NewReader(out))
		for {
			var p pkgInfo
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else if err != nil {
				listErr = err
				return
			}
			listed[p.ImportPath] = &p
		}
	})
	if listErr != nil {
		t.Fatal(listErr)
	}
	return listed
}

// deps returns every package pkg links (transitively, pkg excluded).
func deps(pkgs map[string]*pkgInfo, pkg string) map[string]bool {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(p string) {
		info := pkgs[p]
		if info == nil {
			return
		}
		for _, imp := range info.Imports {
			if !seen[imp] {
				seen[imp] = true
				walk(imp)
			}
		}
	}
	walk(pkg)
	return seen
}

// rel turns an import path of ours into a path relative to the module root.
func rel(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, module), "/") }

// under reports whether package path p (relative) is prefix or below it.
func under(p, prefix string) bool { return p == prefix || strings.HasPrefix(p, prefix+"/") }

// internalOwners are the only folders allowed directly under internal/: the
// three owners and the packages shared by more than one binary.
var internalOwners = map[string]string{
	"node":         "linked by the data-plane binaries (ztunnel, zctl; the waypoint)",
	"controlplane": "linked by ztunnel-cp only",
	"testing":      "test support, never linked into a product binary",
	"api":          "shared: our protos for Istio's APIs",
	"cluster":      "shared: typed cluster objects (control plane, node agent)",
	"identity":     "shared: SPIFFE identities and certificates",
	"netns":        "shared: entering network namespaces",
	"drain":        "shared: two-phase shutdown",
	"xds":          "shared: delta xDS client (node proxy, waypoint), type URLs and status types (server: controlplane/xdsserver)",
	"daemon":       "shared: the daemons' runtime skeleton (logs, readiness, admin)",
	"otlp":         "shared: OTLP span exporters (waypoint tracing, node proxy connection spans)",
}

// TestLayoutOwners fails when a package sits directly under internal/ outside
// the owner folders and the shared list.
func TestLayoutOwners(t *testing.T) {
	for p := range goList(t) {
		r := rel(p)
		if !strings.HasPrefix(p, module+"/internal/") {
			continue
		}
		top := strings.SplitN(strings.TrimPrefix(r, "internal/"), "/", 2)[0]
		if _, ok := internalOwners[top]; !ok {
			t.Errorf("%s: internal/%s is not an owner folder or a shared package (see internalOwners)", r, top)
		}
	}
}

// layoutRule forbids packages under From (relative prefixes) from linking
// packages under any of Forbidden, unless the importing package is under
// one of Except.
type layoutRule struct {
	from      []string
	forbidden []string
	except    []string
	why       string
}

var layoutRules = []layoutRule{
	{
		from:      []string{"internal/node"},
		forbidden: []string{"internal/controlplane"},
		why:       "the node proxy never links the control plane",
	},
	{
		from:      []string{"internal/controlplane"},
		forbidden: []string{"proxy", "hbone", "dnsproxy", "internal/node"},
		why:       "the control plane never links the data path",
	},
	{
		from:      []string{""}, // every package of ours
		forbidden: []string{"internal/testing"},
		except:    []string{"internal/testing", "e2e", "bench", "cmd/ztunnel-demo"},
		why:       "test support is never linked into a product binary (cmd/ztunnel-demo is the demo harness's main)",
	},
	{
		from:      []string{""},
		forbidden: []string{"internal/controlplane"},
		except:    []string{"internal/controlplane", "cmd/ztunnel-cp", "internal/testing", "e2e", "bench", "cmd/ztunnel-demo", "cmd/zctl"},
		why: "only ztunnel-cp links the control plane (the node proxy embeds none: a local mesh runs ztunnel-cp " +
			"beside it; cmd/zctl's analyze runs the control plane's own translation offline, as explain runs the " +
			"node's routing)",
	},
	{
		from:      []string{"hbone"},
		forbidden: []string{"internal/node", "internal/controlplane", "k8s.io/client-go"},
		why:       "the tunnel knows nothing of the mesh state, the CA or Kubernetes",
	},
	{
		from:      []string{"proxy", "dnsproxy"},
		forbidden: []string{"internal/controlplane", "k8s.io/client-go"},
		why:       "the data path never links the control plane or a Kubernetes client",
	},
	{
		from:      []string{"proxy/route"},
		forbidden: []string{"hbone", "internal/netns"},
		why:       "the routing decision is pure: zctl links it without any listener or socket code",
	},
}

// TestLayoutRules checks layoutRules on the packages' non-test imports.
func TestLayoutRules(t *testing.T) {
	pkgs := goList(t)
	var ours []string
	for p := range pkgs {
		if p == module || strings.HasPrefix(p, module+"/") {
			ours = append(ours, p)
		}
	}
	sort.Strings(ours)
	for _, r := range layoutRules {
		for _, p := range ours {
			rp := rel(p)
			matched := false
			for _, f := range r.from {
				if f == "" || under(rp, f) {
					matched = true
				}
			}
			for _, e := range r.except {
				if under(rp, e) {
					matched = false
				}
			}
			if !matched {
				continue
			}
			for d := range deps(pkgs, p) {
				rd := d
				if strings.HasPrefix(d, module+"/") {
					rd = rel(d)
				}
				for _, f := range r.forbidden {
					if under(rd, f) {
						t.Errorf("%s links %s: %s", rp, rd, r.why)
					}
				}
			}
		}
	}
}

// TestBinaryDeps compares, for each binary under cmd/, the packages it links
// (ours and third-party, standard library left out) with the committed list
// cmd/<binary>/deps.txt, so a new dependency of a binary shows up in review
// (Tailscale's depaware.txt does the same). Regenerate with -update.
func TestBinaryDeps(t *testing.T) {
	pkgs := goList(t)
	root := repoRoot(t)
	entries, err := os.ReadDir(filepath.Join(root, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		bin := e.Name()
		pkg := module + "/cmd/" + bin
		if pkgs[pkg] == nil {
			t.Errorf("cmd/%s is not a package", bin)
			continue
		}
		var lines []string
		for d := range deps(pkgs, pkg) {
			if info := pkgs[d]; info == nil || info.Standard {
				continue
			}
			lines = append(lines, d)
		}
		sort.Strings(lines)
		want := "# Packages cmd/" + bin + " links (standard library left out), checked by\n" +
			"# internal/testing/repotest TestBinaryDeps; regenerate with\n" +
			"#   go test ./internal/testing/repotest -run TestBinaryDeps -update\n" +
			strings.Join(lines, "\n") + "\n"
		path := filepath.Join(root, "cmd", bin, "deps.txt")
		if *update {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("cmd/%s/deps.txt: %v (run with -update to create it)", bin, err)
			continue
		}
		if string(got) != want {
			t.Errorf("cmd/%s links a different set of packages than cmd/%s/deps.txt says:\n%s\nIf the change is intended, run: go test ./internal/testing/repotest -run TestBinaryDeps -update",
				bin, bin, diffLines(string(got), want))
		}
	}
}

// TestBuildTagsAgree checks that the three places that build the binaries
// use the same build tags (testkit.BuildTags): the Makefile (bin/, what the
// benchmarks run), hack/images (the released images) and testkit (tests).
// A binary built without them links gRPC's tracing and html/template:
// 4.6 MiB more of mapped text and rodata in the node proxy.
func TestBuildTagsAgree(t *testing.T) {
	root := repoRoot(t)
	for file, want := range map[string]string{
		"Makefile":             "GO_BUILD_TAGS := " + testkit.BuildTags + "\n",
		"hack/images/build.go": "const buildTags = \"" + testkit.BuildTags + "\"\n",
	} {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), want) {
			t.Errorf("%s does not say %q: its binaries would be built with other tags than testkit.BuildTags", file, strings.TrimSpace(want))
		}
	}
}

// diffLines lists lines only in want (+) or only in got (-).
func diffLines(got, want string) string {
	g, w := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(got, "\n") {
		g[l] = true
	}
	for _, l := range strings.Split(want, "\n") {
		w[l] = true
	}
	var out []string
	for l := range w {
		if !g[l] {
			out = append(out, "+ "+l)
		}
	}
	for l := range g {
		if !w[l] {
			out = append(out, "- "+l)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// TestFileSizes keeps files readable: no hand-written Go file over 800 lines
// (generated code, marked "Code generated ... DO NOT EDIT.", is exempt), and
// each cmd/<bin>/main.go at most 250 lines, wiring only.
func TestFileSizes(t *testing.T) {
	root := repoRoot(t)
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte("\n// Code generated ")) || bytes.HasPrefix(b, []byte("// Code generated ")) {
			return nil
		}
		lines := bytes.Count(b, []byte("\n"))
		r, _ := filepath.Rel(root, path)
		limit := 800
		if filepath.Base(r) == "main.go" && strings.HasPrefix(r, "cmd"+string(filepath.Separator)) {
			limit = 250
		}
		if lines > limit {
			t.Errorf("%s has %d lines, more than %d: split it along its responsibilities", r, lines, limit)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
