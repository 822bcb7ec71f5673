package bootstrap

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// TestRootPublisherOnAPIServer publishes the root ConfigMap on a real API
// server as a ServiceAccount holding only what the chart's Role grants
// (create configmaps; get and update istio-ca-root-cert): it creates it,
// does not rewrite an identical one, and restores an edited or deleted one.
func TestRootPublisherOnAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := kubeapi.Start(t, kubeapi.Options{})
	const ns = "mesh"
	admin := s.Client()
	if err := s.EnsureServiceAccount(ctx, ns, "ztunnel-cp"); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "ztunnel-cp", Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{RootConfigMapName}, Verbs: []string{"get", "update"}},
		},
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "ztunnel-cp", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "ztunnel-cp"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "ztunnel-cp", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := s.CreateServiceAccountToken(ctx, ns, "ztunnel-cp", "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(s.TokenConfig(tok))
	if err != nil {
		t.Fatal(err)
	}
	const root = "-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n"
	p := &RootPublisher{Client: c, Namespace: ns, RootPEM: []byte(root)}
	get := func() *corev1.ConfigMap {
		t.Helper()
		cm, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, RootConfigMapName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	publish := func(wantWrite bool) {
		t.Helper()
		wrote, err := p.publish(ctx)
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		if wrote != wantWrite {
			t.Errorf("publish wrote = %v, want %v", wrote, wantWrite)
		}
		if got := get().Data[RootConfigMapKey]; got != root {
			t.Errorf("%s = %q, want the root", RootConfigMapKey, got)
		}
	}
	publish(true) // created
	rv := get().ResourceVersion
	publish(false) // identical: no write
	if get().ResourceVersion != rv {
		t.Error("an identical ConfigMap was rewritten")
	}
	cm := get()
	cm.Data[RootConfigMapKey] = "stale"
	if _, err := admin.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	publish(true) // edited: restored
	if err := admin.CoreV1().ConfigMaps(ns).Delete(ctx, RootConfigMapName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Run recreates it and reports Published; it stops with its context.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(runCtx) }()
	for !p.Published() {
		select {
		case <-ctx.Done():
			t.Fatal("never published")
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	<-done
	if got := get().Data[RootConfigMapKey]; got != root {
		t.Errorf("after Run: %q, want the root", got)
	}

	// Elsewhere the Role grants nothing: the publisher reports the refusal.
	other := &RootPublisher{Client: c, Namespace: "default", RootPEM: []byte(root)}
	if _, err := other.publish(ctx); !apierrors.IsForbidden(err) {
		t.Errorf("publish in another namespace: %v, want Forbidden", err)
	}
}
