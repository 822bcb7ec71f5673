package node

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestNodeTenantServiceEntryRange (issue 24) on the real node: namespace
// tn-evil, published mesh-wide (its namespace carries the label the
// chart's serviceEntryVisibility turns PUBLIC, so visibility does not hide
// the attack and only address ownership stands in the way), creates a
// ServiceEntry whose ranges cover the victim's pod IP and its Service's
// ClusterIP, with a STATIC endpoint of its own. The victim's pod-to-pod and
// Service traffic still reaches the victim's pod, and the node proxy's
// access log never names the attacker's ServiceEntry for it.
func TestNodeTenantServiceEntryRange(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	const victim, evil, host = "tn-victim", "tn-evil", "grab.tn-evil.example"
	e.namespace(t, victim, true)
	e.namespace(t, evil, true)
	ctx := testCtx(t, 4*time.Minute)
	patch := []byte(`{"metadata":{"labels":{"ztunnel-go.io/public-service-entries":"true"}}}`)
	if _, err := e.node.Client.CoreV1().Namespaces().Patch(ctx, evil, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	srv := e.pod(t, victim, "srv", map[string]string{"app": "srv"}, "serve")
	cli := e.pod(t, victim, "cli", nil, "pause")
	sink := e.pod(t, evil, "sink", map[string]string{"app": "sink"}, "serve")
	svc, err := e.node.Client.CoreV1().Services(victim).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "srv", Namespace: victim},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "srv"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podRange := netip.PrefixFrom(netip.MustParseAddr(srv.Status.PodIP), 16).Masked()
	svcRange := netip.PrefixFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 16).Masked()
	since := time.Now()
	grab := func(extra string) string {
		return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: grab, namespace: %s}
spec:
  hosts: [%s]
  addresses: [%q, %q%s]
  ports: [{number: 8080, name: http, protocol: TCP}, {number: 80, name: http-80, protocol: TCP, targetPort: 8080}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{address: %q}]
`, evil, host, podRange, svcRange, extra, sink.Status.PodIP)
	}
	// The webhook refuses 0.0.0.0/0 at admission, naming the address; the
	// pod and Service ranges need the cluster to judge, so the control
	// plane alone refuses those, and the node proxies never let a range
	// take a workload's or Service's address.
	path := filepath.Join(t.TempDir(), "grab-all.yaml")
	if err := os.WriteFile(path, []byte(grab(`, "0.0.0.0/0"`)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := e.node.Kubectl(ctx, "apply", "-f", path); err == nil || !strings.Contains(out, "spec.addresses[2]: 0.0.0.0/0") {
		t.Fatalf("kubectl apply of a ServiceEntry holding 0.0.0.0/0: %v %q, want the webhook to refuse spec.addresses[2]", err, out)
	}
	e.apply(t, grab(""))

	srvURL, srvAddr := podURL(srv, 8080)
	svcURL := "http://" + svc.Spec.ClusterIP + "/"
	// Long enough for the entry to reach the node proxy: if it captured
	// anything, these GETs would answer pod=sink.
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, url := range []string{srvURL, svcURL} {
			out, err := e.get(ctx, victim, "cli", url)
			if err != nil || !strings.Contains(out, "pod=srv ") {
				t.Fatalf("%s/cli GET %s: %v %q, want the victim's pod", victim, url, err, out)
			}
		}
		time.Sleep(time.Second)
	}
	_, out, lines := e.accessLog(t, ctx, since, cli.Status.PodIP, srvAddr, 0, 1)
	for _, l := range out {
		if l.str("dst.service") == host {
			t.Errorf("pod-to-pod connection routed as %s/%s: %v", evil, host, l.Fields)
		}
	}
	for _, l := range lines {
		if l.str("msg") == "connection complete" && l.str("src.namespace") == victim && l.str("dst.service") == host {
			t.Errorf("victim connection routed as the attacker's ServiceEntry: %v", l.Fields)
		}
	}
}
