package kubeapi_test

import (
	"context"
	"slices"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// TestServer runs against one real etcd + kube-apiserver (started once: ~4 s),
// each subtest leaving state the next may read.
func TestServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := kubeapi.Start(t, kubeapi.Options{})
	admin := s.Client()

	t.Run("Version", func(t *testing.T) {
		v, err := admin.Discovery().ServerVersion()
		if err != nil {
			t.Fatal(err)
		}
		if v.GitVersion != "v1.37.2" {
			t.Errorf("server version %q, want v1.37.2 (ldflags)", v.GitVersion)
		}
	})

	t.Run("Kubeconfig", func(t *testing.T) {
		cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig())
		if err != nil {
			t.Fatal(err)
		}
		c := kubernetes.NewForConfigOrDie(cfg)
		if _, err := c.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{}); err != nil {
			t.Fatalf("kubeconfig client: %v", err)
		}
	})

	t.Run("Namespace", func(t *testing.T) {
		if err := s.EnsureNamespace(ctx, "app", map[string]string{"istio.io/dataplane-mode": "ambient"}); err != nil {
			t.Fatal(err)
		}
		// Idempotent.
		if err := s.EnsureNamespace(ctx, "app", nil); err != nil {
			t.Fatal(err)
		}
		ns, err := admin.CoreV1().Namespaces().Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ns.Labels["istio.io/dataplane-mode"] != "ambient" {
			t.Errorf("labels %v", ns.Labels)
		}
	})

	var caToken string
	t.Run("TokenReview", func(t *testing.T) {
		var err error
		caToken, err = s.CreateServiceAccountToken(ctx, "istio-system", "ztunnel", kubeapi.AudienceIstioCA)
		if err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name      string
			audiences []string
			wantAuth  bool
		}{
			{"istio-ca audience", []string{kubeapi.AudienceIstioCA}, true},
			{"api audiences", nil, true},
			{"other audience", []string{"vault"}, false},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				st := review(ctx, t, admin, caToken, tc.audiences)
				if st.Authenticated != tc.wantAuth {
					t.Fatalf("authenticated=%v (error %q), want %v", st.Authenticated, st.Error, tc.wantAuth)
				}
				if !tc.wantAuth {
					return
				}
				if st.User.Username != "system:serviceaccount:istio-system:ztunnel" {
					t.Errorf("user %q", st.User.Username)
				}
				if !slices.Contains(st.Audiences, kubeapi.AudienceIstioCA) {
					t.Errorf("audiences %v lack %s", st.Audiences, kubeapi.AudienceIstioCA)
				}
			})
		}
	})

	t.Run("PodBoundToken", func(t *testing.T) {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod, err := admin.CoreV1().Pods("app").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "client", Namespace: "app"},
			Spec: corev1.PodSpec{
				NodeName:           "node-a",
				ServiceAccountName: "client",
				Containers:         []corev1.Container{{Name: "app", Image: "example.invalid/app"}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := s.CreatePodToken(ctx, pod, kubeapi.AudienceIstioCA)
		if err != nil {
			t.Fatal(err)
		}
		st := review(ctx, t, admin, tok, []string{kubeapi.AudienceIstioCA})
		if !st.Authenticated {
			t.Fatalf("not authenticated: %s", st.Error)
		}
		for k, want := range map[string]string{
			"authentication.kubernetes.io/pod-name":  "client",
			"authentication.kubernetes.io/pod-uid":   string(pod.UID),
			"authentication.kubernetes.io/node-name": "node-a",
		} {
			if got := st.User.Extra[k]; len(got) != 1 || got[0] != want {
				t.Errorf("extra[%s] = %v, want %s", k, got, want)
			}
		}
	})

	t.Run("RBACDeniesServiceAccount", func(t *testing.T) {
		c := kubernetes.NewForConfigOrDie(s.TokenConfig(caToken))
		_, err := c.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("list pods as an unprivileged ServiceAccount: err=%v, want Forbidden", err)
		}
		_, err = c.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("get node as an unprivileged ServiceAccount: err=%v, want Forbidden", err)
		}
	})

	t.Run("ApplyCRDs", func(t *testing.T) {
		if err := s.ApplyCRDs(ctx); err != nil {
			t.Fatal(err)
		}
		se := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
			"metadata": map[string]any{"name": "ext", "namespace": "app"},
			"spec": map[string]any{
				"hosts":      []any{"ext.example.com"},
				"ports":      []any{map[string]any{"number": int64(443), "name": "tls", "protocol": "TLS"}},
				"resolution": "DNS",
			},
		}}
		if _, err := s.Dynamic().Resource(se).Namespace("app").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ServiceEntry: %v", err)
		}
		for _, gvr := range []schema.GroupVersionResource{
			{Group: "security.istio.io", Version: "v1", Resource: "authorizationpolicies"},
			{Group: "security.istio.io", Version: "v1", Resource: "peerauthentications"},
			{Group: "networking.istio.io", Version: "v1", Resource: "workloadentries"},
			{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"},
			{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gatewayclasses"},
		} {
			if _, err := s.Dynamic().Resource(gvr).List(ctx, metav1.ListOptions{}); err != nil {
				t.Errorf("list %s: %v", gvr, err)
			}
		}
		// A second apply is a no-op, not a conflict.
		if err := s.ApplyCRDs(ctx); err != nil {
			t.Fatalf("second ApplyCRDs: %v", err)
		}
	})

	t.Run("Restart", func(t *testing.T) {
		s.Stop()
		if _, err := admin.CoreV1().Namespaces().Get(ctx, "app", metav1.GetOptions{}); err == nil {
			t.Fatal("API server answered while stopped")
		}
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Namespaces().Get(ctx, "app", metav1.GetOptions{}); err != nil {
			t.Fatalf("namespace after restart: %v", err)
		}
		// The signing key is the same: a token from before still reviews.
		if st := review(ctx, t, admin, caToken, []string{kubeapi.AudienceIstioCA}); !st.Authenticated {
			t.Fatalf("token from before the restart: %s", st.Error)
		}
	})
}

func review(ctx context.Context, t *testing.T, c kubernetes.Interface, token string, aud []string) authenticationv1.TokenReviewStatus {
	t.Helper()
	tr, err := c.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: aud},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenReview: %v", err)
	}
	return tr.Status
}

func TestDecodeObjects(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		kinds []string
	}{
		{"empty", "", nil},
		{"separators only", "---\n---\n", nil},
		{"two documents", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: b}\n", []string{"Namespace", "ServiceAccount"}},
		{"comment-only document", "# nothing\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n", []string{"ConfigMap"}},
		{"list", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: d}}\n- {apiVersion: v1, kind: Service, metadata: {name: e}}\n", []string{"Secret", "Service"}},
		{"json", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"f"}}`, []string{"Pod"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := kubeapi.DecodeObjects([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.GetKind())
			}
			if !slices.Equal(kinds, tc.kinds) {
				t.Errorf("kinds %v, want %v", kinds, tc.kinds)
			}
		})
	}
	if _, err := kubeapi.DecodeObjects([]byte("a: [")); err == nil {
		t.Error("broken YAML decoded without error")
	}
}
