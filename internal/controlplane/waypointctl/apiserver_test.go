package waypointctl

import (
	"context"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestControllerOnAPIServer: a waypoint Gateway gets its ServiceAccount,
// Service and Deployment (owned by the Gateway, running our waypoint image
// with its identity, token and root), the namespace gets the root
// ConfigMap, and the Gateway's status gets the Service's cluster IP and
// Programmed=False until a replica is available, then True. An unmanaged
// Gateway is left alone, and a replica that does not lead writes nothing.
// demoAPI starts a real API server with the CRDs and namespace demo; ctx
// ends with the test (or timeout), and mkGateway creates a waypoint
// Gateway there.
func demoAPI(t *testing.T, timeout time.Duration) (ctx context.Context, clients *kube.Clients,
	mkGateway func(name string, annotations map[string]string) *gatewayv1.Gateway) {
	t.Helper()
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	if err := api.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	if err := api.EnsureNamespace(ctx, "demo", nil); err != nil {
		t.Fatal(err)
	}
	clients, err := kube.NewClients(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	mkGateway = func(name string, annotations map[string]string) *gatewayv1.Gateway {
		t.Helper()
		gw, err := clients.Gateway.GatewayV1().Gateways("demo").Create(ctx, &gatewayv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name, Annotations: annotations},
			Spec: gatewayv1.GatewaySpec{GatewayClassName: WaypointClass,
				Listeners: []gatewayv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return gw
	}
	return ctx, clients, mkGateway
}

func TestControllerOnAPIServer(t *testing.T) {
	ctx, clients, mkGateway := demoAPI(t, 90*time.Second)
	gws := clients.Gateway.GatewayV1().Gateways("demo")
	mkGateway("waypoint", nil)
	mkGateway("byo", map[string]string{ManagedAnnotation: "false"})

	src, err := kube.New(kube.Config{Clients: clients, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{}, 3)
	go func() { _ = src.Run(rctx); done <- struct{}{} }()
	start := func(leading bool) {
		c, err := New(Config{
			Kube: clients.Kube, Gateway: clients.Gateway, Source: src, Leading: func() bool { return leading },
			Image: "registry.example/waypoint:0.1.0", XDSAddress: "ztunnel-cp.istio-system.svc:15012",
			RootPEM: func() []byte { return []byte("ROOT PEM") }, Resync: 200 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = c.Run(rctx); done <- struct{}{} }()
	}
	start(false)
	t.Cleanup(func() { stop(); <-done; <-done; <-done })

	// A replica that does not lead writes nothing.
	time.Sleep(time.Second)
	if _, err := clients.Kube.AppsV1().Deployments("demo").Get(ctx, "waypoint", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a non-leading replica deployed the waypoint (err %v)", err)
	}
	start(true)

	var dep *appsv1.Deployment
	testkit.Eventually(t, 20*time.Second, "the waypoint Deployment", func() bool {
		dep, err = clients.Kube.AppsV1().Deployments("demo").Get(ctx, "waypoint", metav1.GetOptions{})
		return err == nil
	})
	gw, err := gws.Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o := dep.OwnerReferences; len(o) != 1 || o[0].Kind != "Gateway" || o[0].UID != gw.UID {
		t.Errorf("deployment owners = %v, want the Gateway", o)
	}
	pod := dep.Spec.Template.Spec
	if pod.ServiceAccountName != "waypoint" || len(pod.Containers) != 1 || pod.Containers[0].Image != "registry.example/waypoint:0.1.0" ||
		pod.Containers[0].Name != ProxyContainer {
		t.Fatalf("pod spec = %+v", pod)
	}
	env := map[string]string{}
	for _, e := range pod.Containers[0].Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	for k, v := range map[string]string{"GATEWAY_NAME": "waypoint", "POD_NAMESPACE": "metadata.namespace", "INSTANCE_IP": "status.podIP",
		"XDS_ADDRESS": "ztunnel-cp.istio-system.svc:15012", "CA_ADDRESS": "ztunnel-cp.istio-system.svc:15012"} {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	if dep.Spec.Template.Labels["istio.io/dataplane-mode"] != "none" {
		t.Error("the waypoint pod is not excluded from capture")
	}
	audience := ""
	for _, v := range pod.Volumes {
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.ServiceAccountToken != nil {
					audience = s.ServiceAccountToken.Audience
				}
			}
		}
	}
	if audience != "istio-ca" {
		t.Errorf("projected token audience %q, want istio-ca", audience)
	}
	if _, err := clients.Kube.CoreV1().ServiceAccounts("demo").Get(ctx, "waypoint", metav1.GetOptions{}); err != nil {
		t.Error(err)
	}
	cm, err := clients.Kube.CoreV1().ConfigMaps("demo").Get(ctx, RootConfigMap, metav1.GetOptions{})
	if err != nil || cm.Data["root-cert.pem"] != "ROOT PEM" {
		t.Errorf("root ConfigMap = %v, %v", cm, err)
	}
	svc, err := clients.Kube.CoreV1().Services("demo").Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP == "" {
		t.Fatalf("service = %v, %v", svc, err)
	}
	// The managed label: istiod and our translation never bind the
	// waypoint's own Service to a waypoint; istioctl analyze skips it.
	if svc.Labels[ManagedLabel] != ManagedMeshController {
		t.Errorf("service labels %v, want %s=%s", svc.Labels, ManagedLabel, ManagedMeshController)
	}

	programmed := func(want metav1.ConditionStatus) func() bool {
		return func() bool {
			gw, err := gws.Get(ctx, "waypoint", metav1.GetOptions{})
			if err != nil || len(gw.Status.Addresses) != 1 || gw.Status.Addresses[0].Value != svc.Spec.ClusterIP {
				return false
			}
			return slices.ContainsFunc(gw.Status.Conditions, func(c metav1.Condition) bool {
				return c.Type == string(gatewayv1.GatewayConditionProgrammed) && c.Status == want
			})
		}
	}
	testkit.Eventually(t, 20*time.Second, "status.addresses = the Service IP, Programmed False", programmed(metav1.ConditionFalse))

	// No kubelet here: say a replica is available, as the Deployment
	// controller would.
	dep, err = clients.Kube.AppsV1().Deployments("demo").Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep.Status.Replicas, dep.Status.AvailableReplicas, dep.Status.ReadyReplicas = 1, 1, 1
	if _, err := clients.Kube.AppsV1().Deployments("demo").UpdateStatus(ctx, dep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "Programmed True once a replica is available", programmed(metav1.ConditionTrue))

	if _, err := clients.Kube.AppsV1().Deployments("demo").Get(ctx, "byo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an unmanaged Gateway got a Deployment (err %v)", err)
	}
}
