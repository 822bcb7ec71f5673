package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// envIstioctl names Istio's istioctl built from the wrapper module
// hack/istioctl (its cmd/istioctl: istio's ztunnel-config and analyze
// commands); make test-node builds it.
const envIstioctl = "ZTG_ISTIOCTL"

// TestNodeIstioctl points Istio's own istioctl at the installed node, as
// an ambient runbook does, with only --kubeconfig and the Istio namespace
// the chart was installed in (-i istio-system, istioctl's default too):
//
//   - every `istioctl ztunnel-config` view (workload, service, policy,
//     certificate, connections, all), which finds the node proxy by
//     daemonset/ztunnel and port-forwards to its admin port, renders the
//     namespace's pods, its Service with the waypoint and endpoints, its
//     policy, the pods' certificates and open connections; each row of the
//     namespace is one `zctl config-dump` shows for the same node proxy
//     (run in the proxy pod's network namespace, where its admin listens);
//   - `istioctl analyze -A` reports nothing about the chart's objects (in
//     istio-system) nor the waypoint's (its Deployment, Service, account,
//     pod and Gateway). A policy that selects no pod is its control: its
//     IST0127 shows the analysis read the live cluster.
func TestNodeIstioctl(t *testing.T) {
	e := mesh(t)
	istioctl := os.Getenv(envIstioctl)
	if istioctl == "" {
		t.Fatalf("%s must name the istioctl built from hack/istioctl (make test-node builds it)", envIstioctl)
	}
	e.waitMeshReady(t)
	const ns = "ictl"
	// Registered first, so it runs after the namespace's own cleanup: the
	// next tests start with the waypoint and the pods gone.
	t.Cleanup(func() { e.waitNamespaceGone(t, ns) })
	e.namespace(t, ns, true)
	ctx := testCtx(t, 6*time.Minute)

	zctl := filepath.Join(t.TempDir(), "zctl")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", zctl, "../../cmd/zctl").CombinedOutput(); err != nil {
		t.Fatalf("go build zctl: %v\n%s", err, out)
	}
	svc, err := e.node.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "srv", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "srv"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.apply(t, fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-intruder, namespace: %[1]s}
spec:
  action: DENY
  rules: [{from: [{source: {principals: [cluster.local/ns/%[1]s/sa/intruder]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: selects-nothing, namespace: %[1]s}
spec:
  selector: {matchLabels: {app: nothing-has-this}}
  action: ALLOW
`, ns))
	srv := e.pod(t, ns, "srv", map[string]string{"app": "srv"}, "serve")
	if out, err := exec.CommandContext(ctx, zctl, "waypoint", "apply", "--kubeconfig", e.node.Kubeconfig,
		"-n", ns, "--enroll-namespace", "--wait").CombinedOutput(); err != nil {
		t.Fatalf("zctl waypoint apply: %v\n%s\nevents:\n%s", err, out, e.events(ns))
	}
	dep, err := e.node.Client.AppsV1().Deployments(ns).Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("waypoint Deployment: %v", err)
	}
	waitUntil(t, 2*time.Minute, func() error {
		if dep, err = e.node.Client.AppsV1().Deployments(ns).Get(ctx, "waypoint", metav1.GetOptions{}); err != nil || !deploymentAvailable(dep) {
			return fmt.Errorf("waypoint Deployment not Available (%v)", err)
		}
		return nil
	})
	wp := e.waypointPod(t, ctx, dep)
	wpSvc, err := e.node.Client.CoreV1().Services(ns).Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("waypoint Service: %v", err)
	}
	// The client keeps connections to the Service open (through the
	// waypoint) for the connections view: new ones, several at once.
	cli := e.pod(t, ns, "cli", nil, "loop", "-url", "http://"+svc.Spec.ClusterIP+"/", "-want", "pod=srv",
		"-workers", "4", "-interval", "5ms")

	zt, err := e.node.Client.CoreV1().Pods(systemNS).Get(ctx, e.componentPod(t, "ztunnel"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ztPid := containerPid(t, zt)
	ictl := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, istioctl, append([]string{"--kubeconfig", e.node.Kubeconfig, "-i", systemNS}, args...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return stdout.String(), fmt.Errorf("istioctl %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		return stdout.String(), nil
	}
	// zctl reads the same node proxy's admin server, on the loopback of
	// the proxy pod's network namespace.
	zc := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, "nsenter", append([]string{"-t", ztPid, "-n", zctl}, args...)...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("zctl %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}

	t.Run("ztunnel-config", func(t *testing.T) {
		id := "spiffe://cluster.local/ns/" + ns + "/sa/default"
		want := map[string][]string{
			"workload": {
				"NAMESPACE POD NAME ADDRESS NODE WAYPOINT PROTOCOL",
				fmt.Sprintf("%s cli %s %s", ns, cli.Status.PodIP, cli.Spec.NodeName),
				fmt.Sprintf("%s srv %s %s", ns, srv.Status.PodIP, srv.Spec.NodeName),
				fmt.Sprintf("%s %s %s %s", ns, wp.Name, wp.Status.PodIP, wp.Spec.NodeName),
			},
			"service": {
				"NAMESPACE SERVICE NAME SERVICE VIP WAYPOINT ENDPOINTS",
				fmt.Sprintf("%s srv %s waypoint 1/1", ns, svc.Spec.ClusterIP),
				fmt.Sprintf("%s waypoint %s None 1/1", ns, wpSvc.Spec.ClusterIP), // never bound to itself
			},
			"policy": {
				"NAMESPACE POLICY NAME ACTION SCOPE",
				ns + " deny-intruder Deny Namespace",
				ns + " selects-nothing Allow WorkloadSelector",
			},
			"certificate": {
				"CERTIFICATE NAME TYPE STATUS VALID CERT SERIAL NUMBER NOT AFTER NOT BEFORE",
			},
		}
		// The node proxy's state moves on (other namespaces' pods going
		// away, certificates rotating) between two fetches: compared until
		// one pair of fetches agrees.
		var last error
		deadline := time.Now().Add(90 * time.Second)
		for {
			if last = compareZtunnelConfig(ictl, zc, ns, id, want); last == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(2 * time.Second)
		}
		if last != nil {
			t.Fatal(last)
		}

		all, err := ictl("ztunnel-config", "all")
		if err != nil {
			t.Fatal(err)
		}
		// Every view's table, one after the other.
		for _, header := range []string{want["workload"][0], want["service"][0], want["policy"][0], want["certificate"][0],
			"WORKLOAD DIRECTION LOCAL REMOTE REMOTE TARGET PROTOCOL"} {
			if !slices.Contains(rows(all), header) {
				t.Errorf("istioctl ztunnel-config all lacks the table %q:\n%s", header, all)
			}
		}
		for _, view := range []string{"workload", "service", "policy", "certificate", "all"} {
			out, err := ictl("ztunnel-config", view, "-o", "json")
			var v any
			if err == nil {
				err = json.Unmarshal([]byte(out), &v)
			}
			if err != nil {
				t.Errorf("istioctl ztunnel-config %s -o json: %v", view, err)
			}
		}

		// Connections: the client's, through the waypoint, in istioctl's
		// view of this node proxy (named: the view is per pod) and zctl's.
		cliName := "cli." + ns
		waitUntil(t, 60*time.Second, func() error {
			out, err := ictl("ztunnel-config", "connections", zt.Name+"."+systemNS)
			if err != nil {
				return err
			}
			for _, r := range rows(out) {
				if strings.HasPrefix(r, cliName+" Outbound "+cliName+":") && strings.HasSuffix(r, " HBONE") {
					t.Logf("istioctl ztunnel-config connections: %s", r)
					return nil
				}
			}
			return fmt.Errorf("istioctl ztunnel-config connections has no outbound HBONE row of %s:\n%s", cliName, out)
		})
		waitUntil(t, 60*time.Second, func() error {
			out, err := zc("connections", "--admin", "localhost:15000")
			if err != nil {
				return err
			}
			if !strings.Contains(out, ns+"/cli "+cli.Status.PodIP+":") {
				return fmt.Errorf("zctl connections has no connection of %s/cli:\n%s", ns, out)
			}
			return nil
		})
	})

	t.Run("analyze", func(t *testing.T) {
		ours := func(origin string) bool {
			kind, name, _ := strings.Cut(origin, " ")
			objNS, objName, _ := strings.Cut(name, "/")
			switch {
			case objNS == systemNS:
				return true
			case objNS != ns:
				return false
			case kind == "Pod":
				return objName == wp.Name
			}
			return objName == "waypoint" // Deployment, Service, ServiceAccount, Gateway
		}
		var msgs []struct{ Code, Level, Origin, Message string }
		// The analysis reads the cluster's informers: retried until the
		// control's finding is there.
		waitUntil(t, 60*time.Second, func() error {
			out, err := ictl("analyze", "-A", "-o", "json")
			if err != nil {
				return err
			}
			msgs = nil
			if err := json.Unmarshal([]byte(out), &msgs); err != nil {
				return fmt.Errorf("istioctl analyze -A -o json: %w\n%s", err, out)
			}
			for _, m := range msgs {
				if m.Code == "IST0127" && m.Origin == "AuthorizationPolicy "+ns+"/selects-nothing" {
					return nil
				}
			}
			return fmt.Errorf("istioctl analyze -A does not report the policy that selects nothing (IST0127): %+v", msgs)
		})
		for _, m := range msgs {
			t.Logf("istioctl analyze: %s [%s] (%s) %s", m.Level, m.Code, m.Origin, m.Message)
			if ours(m.Origin) {
				t.Errorf("istioctl analyze -A reports our %s: [%s] %s", m.Origin, m.Code, m.Message)
			}
		}
	})
}

// compareZtunnelConfig renders istioctl's workload, service, policy and
// certificate views and zctl's config-dump sections of the same node
// proxy: istioctl's rows of namespace ns (certificates: of identity id)
// must begin with each of want's (whole words) and each be one zctl shows.
func compareZtunnelConfig(ictl, zc func(...string) (string, error), ns, id string, want map[string][]string) error {
	var errs []string
	for view, section := range map[string]string{"workload": "workloads", "service": "services", "policy": "policies", "certificate": "certificates"} {
		iout, err := ictl("ztunnel-config", view)
		if err != nil {
			return err
		}
		zout, err := zc("config-dump", "--admin", "localhost:15000", section)
		if err != nil {
			return err
		}
		irows, zrows := rows(iout), rows(zout)
		var mine []string
		for i, r := range irows {
			f := strings.Fields(r)
			if i == 0 || (view == "certificate" && f[0] == id) || (view != "certificate" && f[0] == ns) {
				mine = append(mine, r)
			}
		}
		for _, w := range want[view] {
			if !slices.ContainsFunc(mine, func(r string) bool { return strings.HasPrefix(r+" ", w+" ") }) {
				errs = append(errs, fmt.Sprintf("istioctl ztunnel-config %s lacks %q:\n%s", view, w, iout))
			}
		}
		if view == "certificate" {
			var leaf, root bool
			for _, r := range mine[1:] {
				f := strings.Fields(r)
				leaf = leaf || (len(f) > 2 && f[1] == "Leaf" && f[2] == "Available")
				root = root || (len(f) > 2 && f[1] == "Root" && f[2] == "Available")
			}
			if !leaf || !root {
				errs = append(errs, fmt.Sprintf("istioctl ztunnel-config certificate has no available leaf and root of %s:\n%s", id, iout))
			}
		}
		for _, r := range mine {
			if !slices.Contains(zrows, r) {
				errs = append(errs, fmt.Sprintf("istioctl ztunnel-config %s row %q is not in zctl config-dump %s:\n%s", view, r, section, zout))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

// rows are the output's lines with each run of spaces made one.
func rows(out string) []string {
	var rs []string
	for l := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rs = append(rs, strings.Join(f, " "))
		}
	}
	return rs
}

// waitNamespaceGone waits (up to a minute) until the namespace is deleted.
func (e *nodeEnv) waitNamespaceGone(t *testing.T, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if _, err := e.node.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Errorf("namespace %s still there 60s after its deletion", ns)
}
