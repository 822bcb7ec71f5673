package deploy_test

import (
	"context"
	"errors"
	"os"
	"path"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubeauth"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestChartTokenPodBound: the node proxy's token is the one istiod's (and
// our CA's) node authorization accepts for impersonation: a projected
// ServiceAccount token with audience istio-ca, which the kubelet binds to
// the pod. The test reads the rendered DaemonSet, creates a pod from its
// template on a Node of a real API server, asks for the token exactly as
// the kubelet does for that projection (its audience, its expiry, bound to
// the pod), and checks that the CA's authenticator maps it to the node; the
// pod's only token is that one (no automounted legacy token), AUTH_TOKEN
// points at it, and once the pod is deleted the token is refused.
func TestChartTokenPodBound(t *testing.T) {
	data, err := os.ReadFile(manifests)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubeapi.DecodeObjects(data)
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	found := false
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" && o.GetName() == "ztunnel" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
				t.Fatal(err)
			}
			found = true
		}
	}
	if !found {
		t.Fatalf("no DaemonSet ztunnel in %s", manifests)
	}
	spec := ds.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("ztunnel pod: automountServiceAccountToken %v, want false (its only token is the istio-ca one)", spec.AutomountServiceAccountToken)
	}
	var proj *corev1.ServiceAccountTokenProjection
	var volName string
	for _, v := range spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil {
				if proj != nil {
					t.Fatalf("ztunnel pod: two projected tokens (%s, %s)", volName, v.Name)
				}
				proj, volName = s.ServiceAccountToken, v.Name
			}
		}
	}
	if proj == nil {
		t.Fatal("ztunnel pod: no projected serviceAccountToken volume")
	}
	if proj.Audience != kubeapi.AudienceIstioCA {
		t.Errorf("projected token audience %q, want %q", proj.Audience, kubeapi.AudienceIstioCA)
	}
	if proj.ExpirationSeconds == nil {
		t.Fatal("projected token has no expirationSeconds")
	}
	var tokenFile string
	for _, c := range spec.Containers {
		if c.Name != "ztunnel" {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name == volName {
				tokenFile = path.Join(m.MountPath, proj.Path)
			}
		}
		for _, e := range c.Env {
			if e.Name == "AUTH_TOKEN" && e.Value != tokenFile {
				t.Errorf("AUTH_TOKEN=%q, but the projected token is mounted at %q", e.Value, tokenFile)
			}
		}
	}
	if tokenFile == "" {
		t.Fatalf("container ztunnel does not mount volume %s", volName)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := kubeapi.Start(t, kubeapi.Options{})
	kc := s.Client()
	if err := s.EnsureServiceAccount(ctx, systemNamespace, spec.ServiceAccountName); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// What the DaemonSet controller and the scheduler would create.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: "ztunnel-abcde", Labels: ds.Spec.Template.Labels},
		Spec:       *spec.DeepCopy(),
	}
	pod.Spec.NodeName = "node-a"
	pod, err = kc.CoreV1().Pods(systemNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a pod from the DaemonSet's template: %v", err)
	}
	// The kubelet's request for the projection.
	tr, err := kc.CoreV1().ServiceAccounts(systemNamespace).CreateToken(ctx, spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         []string{proj.Audience},
			ExpirationSeconds: proj.ExpirationSeconds,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token request as the kubelet makes it for the projection: %v", err)
	}
	token := tr.Status.Token

	review, err := kc.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{kubeapi.AudienceIstioCA}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !review.Status.Authenticated {
		t.Fatalf("token review: not authenticated: %s", review.Status.Error)
	}
	for k, want := range map[string]string{
		kubeauth.ExtraPodName: pod.Name, kubeauth.ExtraPodUID: string(pod.UID), kubeauth.ExtraNodeName: "node-a",
	} {
		if got := review.Status.User.Extra[k]; len(got) != 1 || got[0] != want {
			t.Errorf("token review extra %s = %v, want [%s]", k, got, want)
		}
	}

	a, err := kubeauth.New(kubeauth.Config{Client: kc, CacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	auth := func() (caserver.Caller, error) {
		return a.Authenticate(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token)))
	}
	want := caserver.Caller{Node: "node-a", ServiceAccount: systemNamespace + "/" + spec.ServiceAccountName}
	if got, err := auth(); err != nil || got != want {
		t.Fatalf("CA authenticator: %+v, %v; want %+v (a node proxy allowed to ask for its node's workloads)", got, err, want)
	}

	if err := kc.CoreV1().Pods(systemNamespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	testkit.Eventually(t, 20*time.Second, "the deleted pod's token to be refused", func() bool {
		_, lastErr = auth()
		return errors.Is(lastErr, caserver.ErrUnauthenticated)
	})
}
