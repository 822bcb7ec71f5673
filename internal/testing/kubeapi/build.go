package kubeapi

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// EnvBinDir names the environment variable that points at a directory
// holding prebuilt etcd, kube-apiserver and kubectl (what `hack/k8s/build.sh
// k8s` prints). When set, Start never builds. The Makefile sets it after
// building once, before the tests run.
const EnvBinDir = "ZTG_K8S_BIN"

// coldBuild is how long a build with empty Go caches takes on 2 cores
// (as of 2026-11), used to refuse a build that cannot finish before the test
// binary's deadline.
const coldBuild = 15 * time.Minute

// built memoizes the binaries' directory for the whole process: building
// is slow and every Start in a test binary wants the same answer. This is
// the package's only mutable state.
var built struct {
	once sync.Once
	dir  string
	err  error
}

// binDir returns the directory holding etcd and kube-apiserver: $ZTG_K8S_BIN,
// or what hack/k8s/build.sh prints, building once per process.
func binDir(t testkit.TB) (string, error) {
	if d := os.Getenv(EnvBinDir); d != "" {
		return d, nil
	}
	built.once.Do(func() { built.dir, built.err = build(t) })
	return built.dir, built.err
}

func build(t testkit.TB) (string, error) {
	script, err := buildScript()
	if err != nil {
		return "", err
	}
	// -n: is it built already? Exit status 3 means not.
	out, err := exec.Command(script, "-n", "k8s").Output()
	if err == nil {
		return strings.TrimSpace(string(out)), nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		return "", fmt.Errorf("%s -n k8s: %w", script, err)
	}
	if dl, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if d, ok := dl.Deadline(); ok && time.Until(d) < coldBuild {
			return "", fmt.Errorf("etcd and kube-apiserver are not built and the test deadline is %v away; "+
				"a first build takes ~12 min: run `%s k8s` first (or `go test -timeout 30m`)",
				time.Until(d).Round(time.Second), script)
		}
	}
	t.Logf("kubeapi: building etcd and kube-apiserver with %s (~12 min the first time on 2 cores)", script)
	cmd := exec.Command(script, "k8s")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr // progress, visible with go test -v
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building etcd and kube-apiserver with %s failed: %w "+
			"(it needs the Go module proxy and ~6 GB of disk for the Go caches)", script, err)
	}
	return strings.TrimSpace(stdout.String()), nil
}

// buildScript finds hack/k8s/build.sh in the repository (testkit.ModuleRoot).
func buildScript() (string, error) {
	p, err := repoFile("hack/k8s/build.sh")
	if err != nil {
		return "", fmt.Errorf("%w; set %s to a directory holding etcd and kube-apiserver", err, EnvBinDir)
	}
	return p, nil
}

// repoFile returns rel (a path from the repository root) when it exists.
func repoFile(rel string) (string, error) {
	root, err := testkit.ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("kubeapi: %w", err)
	}
	p := filepath.Join(root, filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("kubeapi: %w", err)
	}
	return p, nil
}
