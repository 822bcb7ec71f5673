package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestStatusWriterOnAPIServer writes the redirection annotation as the
// agent's ServiceAccount with only the permissions the chart grants (read
// pods and namespaces, patch pods/status): enabled, pending, removed; a
// write for a pod that was replaced by a namesake does not touch the new
// one.
func TestStatusWriterOnAPIServer(t *testing.T) {
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := api.Client()
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "ztunnel-cni"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := api.EnsureServiceAccount(ctx, "istio-system", "ztunnel-cni"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "ztunnel-cni"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "ztunnel-cni"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "istio-system", Name: "ztunnel-cni"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := api.CreateServiceAccountToken(ctx, "istio-system", "ztunnel-cni", "")
	if err != nil {
		t.Fatal(err)
	}
	kc := kubernetes.NewForConfigOrDie(api.TokenConfig(tok))

	if err := api.EnsureNamespace(ctx, "app", nil); err != nil {
		t.Fatal(err)
	}
	mkPod := func() *corev1.Pod {
		p, err := admin.CoreV1().Pods("app").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web"},
			Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	pod := mkPod()

	src, err := NewSource(kc, "n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewStatusWriter(StatusConfig{Client: kc, Source: src})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { _ = src.Run(runCtx); done <- struct{}{} }()
	go func() { w.Run(runCtx); done <- struct{}{} }()
	defer func() { stop(); <-done; <-done }()

	annotation := func() (string, bool) {
		p, err := admin.CoreV1().Pods("app").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := p.Annotations[AnnotationRedirection]
		return v, ok
	}
	st := agent.PodStatus{UID: string(pod.UID), Namespace: "app", Name: "web"}
	for _, s := range []agent.State{agent.StatePending, agent.StateEnabled} {
		st.State = s
		_ = w.WriteStatus(ctx, st)
		testkit.Eventually(t, 10*time.Second, "annotation "+AnnotationValue(s), func() bool { v, _ := annotation(); return v == AnnotationValue(s) })
	}
	// Failed: the state and the reason, both gone again once enabled.
	errAnnotation := func() (string, bool) {
		p, err := admin.CoreV1().Pods("app").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := p.Annotations[AnnotationRedirectionError]
		return v, ok
	}
	st.State, st.Error = agent.StateFailed, "no network namespace can be proven to be the pod's"
	_ = w.WriteStatus(ctx, st)
	testkit.Eventually(t, 10*time.Second, "failed with its reason", func() bool {
		v, _ := annotation()
		e, _ := errAnnotation()
		return v == RedirectionFailed && e == st.Error
	})
	st.State, st.Error = agent.StateEnabled, ""
	_ = w.WriteStatus(ctx, st)
	testkit.Eventually(t, 10*time.Second, "enabled, reason removed", func() bool {
		v, _ := annotation()
		_, hasErr := errAnnotation()
		return v == RedirectionEnabled && !hasErr
	})
	_ = w.ClearStatus(ctx, agent.PodRef{UID: string(pod.UID), Namespace: "app", Name: "web"})
	testkit.Eventually(t, 10*time.Second, "annotation removed", func() bool { _, ok := annotation(); return !ok })
	testkit.Eventually(t, 10*time.Second, "queue drained", func() bool { return w.Pending() == 0 })

	// A namesake replaces the pod; a late write for the old one is dropped.
	if err := admin.CoreV1().Pods("app").Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	mkPod()
	st.State = agent.StateEnabled
	_ = w.WriteStatus(ctx, st)
	testkit.Eventually(t, 10*time.Second, "the stale write dropped", func() bool { return w.Pending() == 0 })
	if _, ok := annotation(); ok {
		t.Fatal("a write for the old pod landed on its namesake")
	}
}
