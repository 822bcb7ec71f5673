package conformance

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/realnode"
)

const (
	systemNS = "istio-system"
	release  = "ztunnel-go"
)

// meshEnv is the real node with our chart installed.
type meshEnv struct {
	node    *realnode.Node
	version string // VERSION: the images' tag and the report's implementation version
}

// startMesh brings up the real node of make test-node (the same
// environment: ZTG_REQUIRE_NODE=1 and the ZTG_* directories the Makefile
// passes), with the conformance echo image among the test images, installs
// Gateway API's standard CRDs and our chart as e2e/node does, and tears the
// node down when t ends. Without ZTG_REQUIRE_NODE=1 the test skips.
func startMesh(t *testing.T) *meshEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("short: needs a real node (make conformance)")
	}
	if os.Getenv("ZTG_REQUIRE_NODE") != "1" {
		t.Skip("needs a real node: run `make conformance` (or set ZTG_REQUIRE_NODE=1 with ZTG_K8S_BIN, ZTG_NODE_BIN, ZTG_HELM_BIN, ZTG_CNI_BIN, ZTG_IMAGES, ZTG_TEST_IMAGES)")
	}
	vars := map[string]string{}
	for _, k := range []string{"ZTG_K8S_BIN", "ZTG_NODE_BIN", "ZTG_HELM_BIN", "ZTG_CNI_BIN", "ZTG_IMAGES", "ZTG_TEST_IMAGES"} {
		if vars[k] = os.Getenv(k); vars[k] == "" {
			t.Fatalf("ZTG_REQUIRE_NODE=1 but %s is not set", k)
		}
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	v, err := os.ReadFile(filepath.Join(repo, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	e := &meshEnv{version: strings.TrimSpace(string(v))}
	var images []string
	for _, c := range []string{"ztunnel", "ztunnel-cni", "ztunnel-cp", "waypoint"} {
		images = append(images, filepath.Join(vars["ZTG_IMAGES"], c+".tar"))
	}
	for _, c := range []string{"pause", "testapp", "coredns", "echo"} {
		images = append(images, filepath.Join(vars["ZTG_TEST_IMAGES"], c+".tar"))
	}
	logf := func(f string, a ...any) { t.Logf(time.Now().Format("15:04:05.000 ")+f, a...) }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	e.node, err = realnode.Start(ctx, realnode.Options{K8sBin: vars["ZTG_K8S_BIN"], NodeBin: vars["ZTG_NODE_BIN"],
		CNIBin: vars["ZTG_CNI_BIN"], Images: images, Logf: logf})
	if err != nil {
		t.Fatal(err)
	}
	logf("node up in %v", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpState(logf)
		}
		t0 := time.Now()
		if err := e.node.Stop(); err != nil {
			t.Errorf("teardown: %v", err)
		}
		logf("teardown in %v (component logs kept in %s)", time.Since(t0).Round(time.Millisecond), e.node.LogDir())
	})

	if err := e.node.CreateMeshCA(ctx, systemNS, "ztunnel-go conformance root"); err != nil {
		t.Fatal(err)
	}
	// Gateway API's standard CRDs of the version the suite tests (it reads
	// their bundle-version annotation into the report).
	gw, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api").Output()
	if err != nil {
		t.Fatalf("gateway-api module: %v", err)
	}
	if out, err := e.node.Kubectl(ctx, "apply", "--server-side", "-f", filepath.Join(strings.TrimSpace(string(gw)), "config", "crd", "standard")); err != nil {
		t.Fatalf("gateway API CRDs: %v\n%s", err, out)
	}
	helmHome := t.TempDir()
	helm := exec.CommandContext(ctx, filepath.Join(vars["ZTG_HELM_BIN"], "helm"), "install", release,
		filepath.Join(repo, "deploy", "chart", "ztunnel-go"), "--namespace", systemNS,
		"--set", "image.registry=ghcr.io/ztunnel-go", "--set", "image.tag="+e.version, "--set", "image.pullPolicy=Never",
		"--set", "controlPlane.replicas=1")
	helm.Env = append(os.Environ(), "HELM_CONFIG_HOME="+helmHome+"/config", "HELM_CACHE_HOME="+helmHome+"/cache",
		"HELM_DATA_HOME="+helmHome+"/data", "KUBECONFIG="+e.node.Kubeconfig)
	if out, err := helm.CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	for _, obj := range []string{"deployment/ztunnel-cp", "daemonset/ztunnel-cni", "daemonset/ztunnel"} {
		if out, err := e.node.Kubectl(ctx, "rollout", "status", "-n", systemNS, obj, "--timeout=240s"); err != nil {
			t.Fatalf("%s not ready: %v\n%s", obj, err, out)
		}
	}
	logf("mesh installed %v after the start", time.Since(start).Round(time.Millisecond))
	return e
}

// dumpState logs pods, events and the mesh's logs after a failure.
func (e *meshEnv) dumpState(logf func(string, ...any)) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		{"get", "gateways.gateway.networking.k8s.io,httproutes.gateway.networking.k8s.io", "-A"},
		{"logs", "-n", systemNS, "-l", "app=ztunnel", "--tail=80"},
		{"logs", "-n", systemNS, "-l", "app=ztunnel-cp", "--tail=60"},
		{"logs", "-n", "gateway-conformance-mesh", "deployment/" + waypointName, "--tail=80"},
	} {
		out, _ := e.node.Kubectl(ctx, args...)
		logf("--- kubectl %s\n%s", strings.Join(args, " "), out)
	}
}
