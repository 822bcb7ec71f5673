package waypointctl

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
)

// TestControllerCRLOnAPIServer: with CRLPEM set, every waypoint namespace
// gets the CRLs as ConfigMap istio-ca-crl and the built-in Deployment sets
// CRL_PATH and mounts it; an update reaches the ConfigMap on the next
// reconcile; CRLs that cannot be read leave the Gateway Programmed=False
// naming them, and its Deployment as it was (never one without the CRLs).
func TestControllerCRLOnAPIServer(t *testing.T) {
	ctx, clients, mkGateway := demoAPI(t, 60*time.Second)
	gw := mkGateway("waypoint", nil)
	type crlRead struct {
		pem []byte
		err error
	}
	var cur atomic.Pointer[crlRead]
	cur.Store(&crlRead{pem: []byte("CRL v1")})
	src, err := kube.New(kube.Config{Clients: clients})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{
		Kube: clients.Kube, Gateway: clients.Gateway, Source: src,
		Image: "registry.example/waypoint:0.1.0", XDSAddress: "ztunnel-cp.istio-system.svc:15012",
		RootPEM: func() []byte { return []byte("ROOT PEM") },
		CRLPEM:  func() ([]byte, error) { r := cur.Load(); return r.pem, r.err },
	})
	if err != nil {
		t.Fatal(err)
	}
	objs := &cluster.Objects{Gateways: []*gatewayv1.Gateway{gw}}
	if failed := c.Reconcile(ctx, objs); failed != 0 {
		t.Fatalf("reconcile with CRLs: %d failed", failed)
	}
	crlData := func() string {
		cm, err := clients.Kube.CoreV1().ConfigMaps("demo").Get(ctx, CRLConfigMap, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data[CRLKey]
	}
	if d := crlData(); d != "CRL v1" {
		t.Fatalf("CRL ConfigMap holds %q", d)
	}
	dep, err := clients.Kube.AppsV1().Deployments("demo").Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template.Spec
	env := slices.ContainsFunc(pod.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "CRL_PATH" && e.Value == CRLDir+"/"+CRLKey })
	mount := slices.ContainsFunc(pod.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "istio-ca-crl" && m.MountPath == CRLDir })
	vol := slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.ConfigMap != nil && v.ConfigMap.Name == CRLConfigMap })
	if !env || !mount || !vol {
		t.Fatalf("built-in Deployment with CRLs: CRL_PATH %v, mount %v, volume %v", env, mount, vol)
	}

	cur.Store(&crlRead{pem: []byte("CRL v2")})
	if failed := c.Reconcile(ctx, objs); failed != 0 || crlData() != "CRL v2" {
		t.Fatalf("an updated CRL: %d failed, ConfigMap %q", failed, crlData())
	}

	cur.Store(&crlRead{err: errors.New("open /var/run/secrets/istio-crl/ca-crl.pem: no such file or directory")})
	if failed := c.Reconcile(ctx, objs); failed != 1 {
		t.Fatalf("unreadable CRLs: %d failed, want the Gateway refused", failed)
	}
	got, err := clients.Gateway.GatewayV1().Gateways("demo").Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(got.Status.Conditions, func(c metav1.Condition) bool { return c.Type == string(gatewayv1.GatewayConditionProgrammed) })
	if i < 0 || got.Status.Conditions[i].Status != metav1.ConditionFalse || !strings.Contains(got.Status.Conditions[i].Message, "waypoint CRLs") {
		t.Errorf("Programmed condition with unreadable CRLs: %+v", got.Status.Conditions)
	}
	if d := crlData(); d != "CRL v2" {
		t.Errorf("the CRLs in force were replaced by a failed read: %q", d)
	}
	after, err := clients.Kube.AppsV1().Deployments("demo").Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil || after.Generation != dep.Generation {
		t.Errorf("the Deployment changed on a failed CRL read: generation %d → %d (%v)", dep.Generation, after.Generation, err)
	}
}
