package kubeauth

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"

	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// TestOnAPIServer reviews real tokens: a node proxy's pod-bound token maps
// to its node (from the node-name extra when the Node exists, else from the
// bound pod read back from the API), an unbound token of the node account
// and a workload token are plain callers, other audiences and garbage are
// refused, and Placement finds pods by node and service account.
func TestOnAPIServer(t *testing.T) {
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kc := api.Client()
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mkPod := func(ns, name, node, sa string) *corev1.Pod {
		t.Helper()
		if err := api.EnsureServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
		p, err := kc.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	zt1 := mkPod("istio-system", "ztunnel-1", "n1", "ztunnel")
	// n2 has no Node object: the token carries no node-name extra.
	zt2 := mkPod("istio-system", "ztunnel-2", "n2", "ztunnel")
	web := mkPod("app", "web", "n2", "web")

	token := func(p *corev1.Pod, aud string) string {
		t.Helper()
		tok, err := api.CreatePodToken(ctx, p, aud)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	unbound, err := api.CreateServiceAccountToken(ctx, "istio-system", "ztunnel", kubeapi.AudienceIstioCA)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Client: kc, CacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		token   string
		want    caserver.Caller
		wantErr bool
	}{
		{name: "node proxy, node from the token", token: token(zt1, kubeapi.AudienceIstioCA), want: caserver.Caller{Node: "n1", ServiceAccount: "istio-system/ztunnel"}},
		{name: "node proxy, node from the bound pod", token: token(zt2, kubeapi.AudienceIstioCA), want: caserver.Caller{Node: "n2", ServiceAccount: "istio-system/ztunnel"}},
		{name: "node account, unbound token", token: unbound, want: caserver.Caller{ServiceAccount: "istio-system/ztunnel"}},
		{name: "workload", token: token(web, kubeapi.AudienceIstioCA), want: caserver.Caller{ServiceAccount: "app/web"}},
		{name: "wrong audience", token: token(zt1, kubeapi.DefaultAudience), wantErr: true},
		{name: "garbage", token: "not-a-jwt", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := a.Authenticate(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+tt.token)))
			if tt.wantErr {
				if !errors.Is(err, caserver.ErrUnauthenticated) {
					t.Fatalf("err = %v, want ErrUnauthenticated", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}

	// A deleted node proxy pod's token is no longer valid.
	tok2 := token(zt2, kubeapi.AudienceIstioCA)
	if err := kc.CoreV1().Pods("istio-system").Delete(ctx, zt2.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	// The API server's token authenticator reads the bound pod through its
	// own cache, so the deletion takes a moment to reach it.
	var lastErr error
	testkit.Eventually(t, 20*time.Second, "the deleted pod's token to be refused", func() bool {
		_, lastErr = a.Authenticate(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+tok2)))
		return errors.Is(lastErr, caserver.ErrUnauthenticated)
	})

	p := &Placement{Client: kc}
	for _, tt := range []struct {
		node, ns, sa string
		want         bool
	}{
		{"n2", "app", "web", true},
		{"n1", "app", "web", false},
		{"n2", "app", "default", false},
		{"n1", "istio-system", "ztunnel", true},
	} {
		if got := p.OnNode(tt.node, tt.ns, tt.sa); got != tt.want {
			t.Errorf("OnNode(%s, %s/%s) = %v, want %v", tt.node, tt.ns, tt.sa, got, tt.want)
		}
	}
}
