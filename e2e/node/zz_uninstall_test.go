package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/realnode"
)

// go test runs a package's tests in the order of its files' names, each
// file's in the order they are declared: this file sorts last but one, so
// the uninstall runs after every other node test (the upgrade tests
// included) except TestNodeInstallByREADME, which starts from a bare node.

// TestNodeHelmUninstall runs last: after `helm uninstall` the agent has
// removed our plugin from the chain and the ambient pods' rules, and pods in
// kube-system and in a non-ambient namespace still start.
func TestNodeHelmUninstall(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	e.namespace(t, "uninst-amb", true)
	amb := e.pod(t, "uninst-amb", "app", nil, "pause")
	if !strings.Contains(e.podIptables(t, amb), "ISTIO_") {
		t.Fatalf("ambient pod not captured before the uninstall")
	}
	ctx := testCtx(t, 4*time.Minute)
	if out, err := e.helmCmd(ctx, "uninstall", release, "--namespace", systemNS, "--wait", "--timeout", "2m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	waitUntil(t, 90*time.Second, func() error {
		pods, err := e.node.Client.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left in %s", len(pods.Items), systemNS)
		}
		return nil
	})
	path := filepath.Join(realnode.CNIConfDir, "10-"+realnode.NetworkName+".conflist")
	if data, err := os.ReadFile(path); err != nil || strings.Contains(string(data), "ztunnel-cni") {
		t.Errorf("after uninstall the runtime's CNI config still chains our plugin (%v):\n%s", err, data)
	}
	// The agent's uninstall releases the captured pods (cni/agent
	// releaseAll): no redirect to a node proxy that is gone.
	t.Run("AmbientPodRulesRemoved", func(t *testing.T) {
		waitUntil(t, 30*time.Second, func() error {
			if r := e.podIptables(t, amb); strings.Contains(r, "ISTIO_") {
				return fmt.Errorf("ambient pod %s keeps its capture rules after helm uninstall:\n%s", amb.Status.PodIP, r)
			}
			return nil
		})
	})
	e.namespace(t, "uninst-plain", false)
	e.pod(t, "uninst-plain", "app", nil, "pause")
	e.pod(t, "kube-system", "after-uninstall", nil, "pause")
	t.Cleanup(func() {
		_ = e.node.Client.CoreV1().Pods("kube-system").Delete(context.Background(), "after-uninstall", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
}
