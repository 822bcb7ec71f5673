package node

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/realnode"
)

const ambientLabel = "istio.io/dataplane-mode"

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitMeshReady waits for the two DaemonSets and the control plane to be
// rolled out (kubectl rollout status: every pod updated and Ready).
func (e *nodeEnv) waitMeshReady(t *testing.T) {
	t.Helper()
	ctx := testCtx(t, 4*time.Minute)
	for _, obj := range []string{"deployment/ztunnel-cp", "daemonset/ztunnel-cni", "daemonset/ztunnel"} {
		if out, err := e.node.Kubectl(ctx, "rollout", "status", "-n", systemNS, obj, "--timeout=180s"); err != nil {
			t.Fatalf("%s not ready: %v\n%s", obj, err, out)
		}
	}
}

// namespace creates a namespace (ambient or not) deleted at the end of t.
func (e *nodeEnv) namespace(t *testing.T, name string, ambient bool) {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	labels := map[string]string{}
	if ambient {
		labels[ambientLabel] = "ambient"
	}
	_, err := e.node.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.node.Client.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		_ = e.node.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	// Pods need the namespace's default ServiceAccount (the controller manager makes it).
	waitUntil(t, 30*time.Second, func() error {
		_, err := e.node.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// pod runs the test app with args ("pause" idles, "serve" serves HTTP on
// 8080) and waits until it is Ready.
func (e *nodeEnv) pod(t *testing.T, ns, name string, labels map[string]string, args ...string) *corev1.Pod {
	t.Helper()
	ctx := testCtx(t, 2*time.Minute)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "app", Image: realnode.TestAppImage, ImagePullPolicy: corev1.PullNever, Args: args,
				Env: []corev1.EnvVar{
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
					{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
				},
			}},
		},
	}
	if len(args) > 0 && args[0] == "serve" {
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
	}
	if _, err := e.node.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("pod %s/%s: %v", ns, name, err)
	}
	var got *corev1.Pod
	waitUntil(t, 90*time.Second, func() error {
		var err error
		got, err = e.node.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if podReady(got) {
			return nil
		}
		return fmt.Errorf("pod %s/%s not Ready: phase %s %s", ns, name, got.Status.Phase, podWhy(got))
	})
	return got
}

// podReady: p's Ready condition is True.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func podWhy(p *corev1.Pod) string {
	var b strings.Builder
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			fmt.Fprintf(&b, " %s: %s;", c.Type, c.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			fmt.Fprintf(&b, " %s waiting: %s %s;", cs.Name, w.Reason, w.Message)
		}
		if x := cs.State.Terminated; x != nil {
			fmt.Fprintf(&b, " %s terminated: %s %s;", cs.Name, x.Reason, x.Message)
		}
	}
	return b.String()
}

// events lists the namespace's events as text (sandbox errors land here).
func (e *nodeEnv) events(ns string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _ := e.node.Kubectl(ctx, "get", "events", "-n", ns, "--sort-by=.lastTimestamp")
	return out
}

func waitUntil(t *testing.T, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("after %v: %v", d, err)
}

// podIptables is iptables-save (nft and legacy) inside the pod's network
// namespace, entered through its container's pid from containerd.
func (e *nodeEnv) podIptables(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	pid := containerPid(t, p)
	var b strings.Builder
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		if _, err := exec.LookPath(save); err != nil {
			continue
		}
		out, err := exec.Command("nsenter", "-t", pid, "-n", save).CombinedOutput()
		if err != nil {
			t.Fatalf("nsenter %s %s: %v: %s", pid, save, err, out)
		}
		b.Write(out)
	}
	return b.String()
}

// containerPid is the host pid of the pod's first container.
func containerPid(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	if len(p.Status.ContainerStatuses) == 0 {
		t.Fatalf("pod %s/%s has no container status", p.Namespace, p.Name)
	}
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	ctx := testCtx(t, 10*time.Second)
	out, err := realnode.Ctr(ctx, "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == id {
			return f[1]
		}
	}
	t.Fatalf("no containerd task for %s/%s container %s in:\n%s", p.Namespace, p.Name, id, out)
	return ""
}

// exec runs a command in the pod's container through the kubelet.
func (e *nodeEnv) exec(ctx context.Context, ns, pod string, cmd ...string) (string, error) {
	return e.node.Kubectl(ctx, append([]string{"exec", "-n", ns, pod, "--"}, cmd...)...)
}
