package controlplane

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/caapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// TestPlacement: without Config.Placement the CA answers from the latest
// translation (CachedPlacement); with one, it asks that instead, so a pod
// the snapshot does not know yet can still get its certificate.
func TestPlacement(t *testing.T) {
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := caserver.NewNodeTokens(map[string]string{"node0": "tok0"})
	if err != nil {
		t.Fatal(err)
	}
	objs := &cluster.Objects{Pods: []*corev1.Pod{{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "demo"},
		Spec:       corev1.PodSpec{NodeName: "node0", ServiceAccountName: "known"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}}}
	live := func(node, ns, sa string) bool { return node == "node0" && ns == "demo" && sa == "late" }
	tests := []struct {
		name      string
		placement caserver.Placement
		sa        string
		want      codes.Code
	}{
		{"snapshot: known pod", nil, "known", codes.OK},
		{"snapshot: pod not delivered yet", nil, "late", codes.PermissionDenied},
		{"live: pod not delivered yet", caserver.PlacementFunc(live), "late", codes.OK},
		{"live: refuses what it does not find", caserver.PlacementFunc(live), "known", codes.PermissionDenied},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cp, err := New(Config{Source: local.New(t.TempDir(), nil, 0), Translate: translate.LocalDefaults(), CA: c, Auth: auth, Placement: tc.placement})
			if err != nil {
				t.Fatal(err)
			}
			cp.Apply(objs)
			if !cp.CachedPlacement().OnNode("node0", "demo", "known") || cp.CachedPlacement().OnNode("node0", "demo", "late") {
				t.Error("CachedPlacement does not follow the latest translation")
			}
			id := identity.MustNew("cluster.local", "demo", tc.sa)
			key, _ := identity.GenerateKey()
			csr, _ := identity.NewCSR(id, key)
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer tok0"))
			_, err = cp.ca.CreateCertificate(ctx, &caapi.IstioCertificateRequest{Csr: string(csr)})
			if got := status.Code(err); got != tc.want {
				t.Errorf("certificate for demo/%s on node0: %v, want %v", tc.sa, err, tc.want)
			}
		})
	}
}
