// Package node holds the tests that run on a real single-node Kubernetes
// cluster (internal/testing/realnode): the chart installed with helm, with
// the images make images builds, and pods the kubelet runs through
// containerd and the runtime-invoked CNI chain. make test-node runs them;
// without ZTG_REQUIRE_NODE=1 they skip.
package node

import (
	"context"
	"flag"
	"fmt"
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

// env is what TestMain set up; nil when the tests skip.
var env *nodeEnv

type nodeEnv struct {
	node    *realnode.Node
	helm    string
	helmEnv []string
	chart   string
	values  []string
}

var skipReason = "node tests need a real node: run `make test-node` (or set ZTG_REQUIRE_NODE=1 with ZTG_K8S_BIN, ZTG_NODE_BIN, ZTG_HELM_BIN, ZTG_CNI_BIN, ZTG_IMAGES, ZTG_TEST_IMAGES)"

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		skipReason = "short: needs a real node (make test-node)"
		os.Exit(m.Run())
	}
	if os.Getenv("ZTG_REQUIRE_NODE") != "1" {
		os.Exit(m.Run())
	}
	code, err := runWithNode(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "node tests:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func need(name string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("ZTG_REQUIRE_NODE=1 but %s is not set", name)
	}
	return v, nil
}

func runWithNode(m *testing.M) (int, error) {
	vars := map[string]string{}
	for _, k := range []string{"ZTG_K8S_BIN", "ZTG_NODE_BIN", "ZTG_HELM_BIN", "ZTG_CNI_BIN", "ZTG_IMAGES", "ZTG_TEST_IMAGES"} {
		v, err := need(k)
		if err != nil {
			return 0, err
		}
		vars[k] = v
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		return 0, err
	}
	version, err := os.ReadFile(filepath.Join(repo, "VERSION"))
	if err != nil {
		return 0, err
	}
	var images []string
	for _, c := range []string{"ztunnel", "ztunnel-cni", "ztunnel-cp", "waypoint"} {
		images = append(images, filepath.Join(vars["ZTG_IMAGES"], c+".tar"))
	}
	for _, c := range []string{"pause", "testapp", "coredns"} {
		images = append(images, filepath.Join(vars["ZTG_TEST_IMAGES"], c+".tar"))
	}
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000 ")+f+"\n", a...) }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	n, err := realnode.Start(ctx, realnode.Options{K8sBin: vars["ZTG_K8S_BIN"], NodeBin: vars["ZTG_NODE_BIN"],
		CNIBin: vars["ZTG_CNI_BIN"], Images: images, Logf: logf})
	if err != nil {
		return 0, err
	}
	logf("node up in %v", time.Since(start).Round(time.Millisecond))
	defer func() {
		t0 := time.Now()
		if err := n.Stop(); err != nil {
			logf("teardown: %v", err)
		}
		logf("teardown in %v (component logs kept in %s)", time.Since(t0).Round(time.Millisecond), n.LogDir())
	}()
	helmHome, err := os.MkdirTemp("", "ztg-node-helm-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(helmHome)
	env = &nodeEnv{
		node:  n,
		helm:  filepath.Join(vars["ZTG_HELM_BIN"], "helm"),
		chart: filepath.Join(repo, "deploy", "chart", "ztunnel-go"),
		helmEnv: append(os.Environ(), "HELM_CONFIG_HOME="+helmHome+"/config", "HELM_CACHE_HOME="+helmHome+"/cache",
			"HELM_DATA_HOME="+helmHome+"/data", "KUBECONFIG="+n.Kubeconfig),
		values: []string{
			"image.registry=ghcr.io/ztunnel-go", "image.tag=" + strings.TrimSpace(string(version)), "image.pullPolicy=Never",
			// No cni.cniBinDir/cniConfDir: the agent reads them from the
			// node's containerd configuration, as on any node.
			"controlPlane.replicas=1", "logLevel=debug",
		},
	}
	if err := n.CreateMeshCA(ctx, systemNS, "ztunnel-go node-test root"); err != nil {
		return 0, err
	}
	// Gateway API's CRDs, which Istio's install asks for first and
	// ztunnel-cp waits for (it lists Gateways, GatewayClasses, HTTPRoutes
	// and GRPCRoutes before it is ready), from the module cache.
	gw, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api").Output()
	if err != nil {
		return 0, fmt.Errorf("gateway-api module: %w", err)
	}
	if out, err := n.Kubectl(ctx, "apply", "--server-side", "-f", filepath.Join(strings.TrimSpace(string(gw)), "config", "crd", "standard")); err != nil {
		return 0, fmt.Errorf("gateway API CRDs: %w\n%s", err, out)
	}
	t0 := time.Now()
	if out, err := env.helmCmd(ctx, "install", release, env.chart, "--namespace", systemNS); err != nil {
		return 0, fmt.Errorf("helm install: %w\n%s", err, out)
	}
	logf("helm install in %v", time.Since(t0).Round(time.Millisecond))
	code := m.Run()
	if code != 0 {
		dumpState(n, logf)
	}
	return code, nil
}

// helmCmd runs helm against the node with the chart's test values.
func (e *nodeEnv) helmCmd(ctx context.Context, args ...string) (string, error) {
	if args[0] == "install" || args[0] == "upgrade" {
		for _, v := range e.values {
			args = append(args, "--set", v)
		}
	}
	cmd := exec.CommandContext(ctx, e.helm, args...)
	cmd.Env = e.helmEnv
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// dumpState logs pods, events and the mesh components' logs after a failure.
func dumpState(n *realnode.Node, logf func(string, ...any)) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		{"logs", "-n", systemNS, "-l", "app=ztunnel-cni", "--tail=60"},
		{"logs", "-n", systemNS, "-l", "app=ztunnel", "--tail=60"},
		{"logs", "-n", systemNS, "-l", "app=ztunnel-cp", "--tail=40"},
		{"logs", "-n", realnode.DNSNamespace, "-l", realnode.DNSLabel + "=kube-dns", "--tail=40"},
	} {
		out, _ := n.Kubectl(ctx, args...)
		logf("--- kubectl %s\n%s", strings.Join(args, " "), out)
	}
}

// mesh returns the environment, skipping the test when there is none.
func mesh(t *testing.T) *nodeEnv {
	t.Helper()
	if env == nil {
		t.Skip(skipReason)
	}
	return env
}
