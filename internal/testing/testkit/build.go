package testkit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// ModulePath is this module's path, the one the go.mod ModuleRoot finds
// declares.
const ModulePath = "github.com/ztunnel-go/ztunnel-go"

// GoTool returns the go command: the one on PATH, else the toolchain that
// built this binary (sudo's secure_path often leaves Go out).
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

var moduleRoot = sync.OnceValues(findModuleRoot)

// ModuleRoot returns the directory holding this module's go.mod: three
// levels above this source file when the sources are where they were
// compiled (tests; the demo and bench/ run with `go run`), else the module
// of the working directory (`go env GOMOD`). Either must declare ModulePath.
// The answer is computed once per process.
func ModuleRoot() (string, error) { return moduleRoot() }

func findModuleRoot() (string, error) {
	var tried []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir := filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
		if declaresModule(dir) {
			return dir, nil
		}
		tried = append(tried, dir)
	}
	out, err := exec.Command(GoTool(), "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("testkit: finding the module root: go env GOMOD: %w", err)
	}
	if gomod := strings.TrimSpace(string(out)); gomod != "" && gomod != os.DevNull {
		dir := filepath.Dir(gomod)
		if declaresModule(dir) {
			return dir, nil
		}
		tried = append(tried, dir)
	}
	return "", fmt.Errorf("testkit: no go.mod declaring module %s in %v nor above the working directory: run from the repository",
		ModulePath, tried)
}

// declaresModule reports whether dir/go.mod declares ModulePath.
func declaresModule(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`) == ModulePath
		}
	}
	return false
}

// built records, per output directory, the commands this process built
// there; mu also serialises the builds, so a second caller for the same
// command waits for the first build instead of starting its own.
var built struct {
	mu   sync.Mutex
	dirs map[string]map[string]bool
}

// BuildTags are the build tags of every binary Build builds, as the
// Makefile's GO_BUILD_TAGS and hack/images build the released ones (with
// CGO_ENABLED=0): grpcnotrace leaves gRPC's golang.org/x/net/trace out, and
// with it html/template, whose reflective method calls keep every exported
// method of every type linked (4.6 MiB of the node proxy's mapped text and
// rodata, nearly all of it resident).
const BuildTags = "grpcnotrace"

// Build builds this module's commands names (./cmd/<name>, from
// ModuleRoot) into outDir with one `go build`, leaving out those this
// process already built there and which are still in place: tests that
// share an outDir build each command once. It returns the names it built.
// The binaries are built without the race detector, whatever the test's
// flags, static and with BuildTags.
func Build(outDir string, names ...string) ([]string, error) {
	if len(names) == 0 {
		return nil, errors.New("testkit: Build: no command names")
	}
	for _, n := range names {
		if n == "" || n == "." || n == ".." || filepath.Base(n) != n {
			return nil, fmt.Errorf("testkit: Build: %q is not a directory name under cmd/", n)
		}
	}
	dir, err := filepath.Abs(outDir)
	if err != nil {
		return nil, fmt.Errorf("testkit: Build: %w", err)
	}
	built.mu.Lock()
	defer built.mu.Unlock()
	var todo []string
	for _, n := range names {
		if slices.Contains(todo, n) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, n)); err == nil && built.dirs[dir][n] {
			continue
		}
		todo = append(todo, n)
	}
	if len(todo) == 0 {
		return nil, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	args := []string{"build", "-tags", BuildTags, "-o", dir + string(filepath.Separator)}
	for _, n := range todo {
		args = append(args, "./cmd/"+n)
	}
	cmd := exec.Command(GoTool(), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("testkit: go build %s in %s: %w\n%s", strings.Join(todo, " "), root, err, out)
	}
	if built.dirs == nil {
		built.dirs = map[string]map[string]bool{}
	}
	if built.dirs[dir] == nil {
		built.dirs[dir] = map[string]bool{}
	}
	for _, n := range todo {
		built.dirs[dir][n] = true
	}
	return todo, nil
}

// BuildBinaries is Build for a test or program: it fails t when the build
// fails, logs what it built and how long that took, and returns outDir. Pass
// t.TempDir() for binaries of one test, or a directory the whole test
// process shares (made and removed in TestMain) to build each command once
// per process. Under `go test -short` it skips t.
func BuildBinaries(t TB, outDir string, names ...string) string {
	t.Helper()
	// A cold build takes minutes and even a warm one links for seconds.
	SkipShort(t, "a build of cmd/"+strings.Join(names, ", cmd/"))
	start := time.Now()
	did, err := Build(outDir, names...)
	if err != nil {
		t.Fatalf("%v", err)
		return outDir
	}
	if len(did) > 0 {
		t.Logf("testkit: built %s into %s in %v", strings.Join(did, ", "), outDir, time.Since(start).Round(time.Millisecond))
	}
	return outDir
}
