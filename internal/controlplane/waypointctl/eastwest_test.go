package waypointctl

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// eastWestGateway is the Gateway Istio's multi-network guide applies.
func eastWestGateway(network string) *gatewayv1.Gateway {
	gw := &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istio-eastwestgateway", UID: "ew-uid"},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: EastWestClass,
			Listeners: []gatewayv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}}},
	}
	if network != "" {
		gw.Labels = map[string]string{NetworkLabel: network}
	}
	return gw
}

// envOf maps a container's env names to values.
func envOf(c corev1ac.ContainerApplyConfiguration) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		if e.Value != nil {
			env[*e.Name] = *e.Value
		}
	}
	return env
}

// TestEastWestDeployment: an istio-east-west Gateway is managed; its
// Deployment (built in, or from the chart's waypoint template) runs the
// binary in east-west mode on the Gateway's network, as its own service
// account, with its pods labelled with that network; a template cannot
// turn it back into a waypoint. A waypoint Gateway gets neither.
func TestEastWestDeployment(t *testing.T) {
	gw := eastWestGateway("network1")
	if !Managed(gw) {
		t.Fatal("an istio-east-west Gateway is not managed")
	}
	c := &Controller{cfg: Config{Image: "img", XDSAddress: "cp:15012", CAAddress: "cp:15012", TrustDomain: "cluster.local"}}
	text := `apiVersion: apps/v1
kind: Deployment
spec:
  template:
    spec:
      containers:
      - name: sidecar
        image: other
      - name: istio-proxy
        image: "{{ .Image }}"
        env:
        - {name: GATEWAY_MODE, value: waypoint}
        - {name: NETWORK, value: "{{ .Network }}-typo"}
`
	tmpl, err := ParseTemplate("t.yaml", text, nil)
	if err != nil {
		t.Fatal(err)
	}
	chart := chartTemplate(t, nil)
	labels := waypointLabels(gw)
	owner := metav1ac.OwnerReference().WithKind("Gateway").WithName(gw.Name).WithUID(gw.UID)
	for name, render := range map[string]func() (map[string]string, *corev1ac.PodTemplateSpecApplyConfiguration, error){
		"built in": func() (map[string]string, *corev1ac.PodTemplateSpecApplyConfiguration, error) {
			d, err := c.deployment(gw, labels, owner, nil, nil)
			if err != nil {
				return nil, nil, err
			}
			return envOf(d.Spec.Template.Spec.Containers[0]), d.Spec.Template, nil
		},
		"chart template": func() (map[string]string, *corev1ac.PodTemplateSpecApplyConfiguration, error) {
			d, err := c.deployment(gw, labels, owner, chart, nil)
			if err != nil {
				return nil, nil, err
			}
			return envOf(d.Spec.Template.Spec.Containers[0]), d.Spec.Template, nil
		},
		"template setting waypoint mode": func() (map[string]string, *corev1ac.PodTemplateSpecApplyConfiguration, error) {
			d, err := c.deployment(gw, labels, owner, tmpl, nil)
			if err != nil {
				return nil, nil, err
			}
			if env := envOf(d.Spec.Template.Spec.Containers[0]); env["GATEWAY_MODE"] != "" {
				t.Errorf("the other container got the mode env: %v", env)
			}
			return envOf(d.Spec.Template.Spec.Containers[1]), d.Spec.Template, nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			env, pod, err := render()
			if err != nil {
				t.Fatal(err)
			}
			if env["GATEWAY_MODE"] != ModeEastWest || env["NETWORK"] != "network1" {
				t.Errorf("env %v, want GATEWAY_MODE=%s NETWORK=network1", env, ModeEastWest)
			}
			if *pod.Spec.ServiceAccountName != "istio-eastwestgateway" {
				t.Errorf("service account %q", *pod.Spec.ServiceAccountName)
			}
			if pod.Labels[NetworkLabel] != "network1" || pod.Labels["istio.io/dataplane-mode"] != "none" {
				t.Errorf("pod labels %v", pod.Labels)
			}
		})
	}

	// Without its network label it is not deployed (Programmed=False with
	// this error), as istiod makes no network gateway of it.
	bare := eastWestGateway("")
	if _, err := c.deployment(bare, waypointLabels(bare), owner, nil, nil); err == nil || !strings.Contains(err.Error(), NetworkLabel) {
		t.Errorf("no network label: err = %v, want one naming %s", err, NetworkLabel)
	}

	// A namespace owner's own east-west Gateway is not deployed: the
	// translation never uses it as a network gateway, and it would run a
	// pod with the gateway's reach in the tenant's namespace.
	tenant := eastWestGateway("network1")
	tenant.Namespace = "team-a"
	if _, err := c.deployment(tenant, waypointLabels(tenant), owner, nil, nil); err == nil || !strings.Contains(err.Error(), "root namespace istio-system") {
		t.Errorf("tenant namespace: err = %v, want one naming the root namespace", err)
	}

	wp := eastWestGateway("network1")
	wp.Spec.GatewayClassName = WaypointClass
	d := c.builtinDeployment(wp, waypointLabels(wp), owner)
	if env := envOf(d.Spec.Template.Spec.Containers[0]); env["GATEWAY_MODE"] != "" || env["NETWORK"] != "" {
		t.Errorf("a waypoint got east-west env %v", env)
	}
	if _, ok := d.Spec.Template.Labels[NetworkLabel]; ok {
		t.Error("a waypoint's pods got the network label")
	}
}

// TestEastWestOnAPIServer: an istio-east-west Gateway gets its
// ServiceAccount, a LoadBalancer Service with the HBONE and status ports
// and a Deployment in east-west mode on its network. Its status names the
// load balancer's address (what other networks dial), not the cluster IP:
// Programmed=False until the load balancer has one and a replica is
// available, then True.
func TestEastWestOnAPIServer(t *testing.T) {
	ctx, clients, _ := demoAPI(t, 90*time.Second)
	gw := eastWestGateway("network1")
	gw.Namespace, gw.UID = "demo", ""
	if _, err := clients.Gateway.GatewayV1().Gateways("demo").Create(ctx, gw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	src, err := kube.New(kube.Config{Clients: clients, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Kube: clients.Kube, Gateway: clients.Gateway, Source: src,
		Image: "registry.example/waypoint:0.1.0", XDSAddress: "ztunnel-cp.istio-system.svc:15012",
		RootPEM: func() []byte { return []byte("ROOT PEM") }, Resync: 200 * time.Millisecond,
		RootNamespace: "demo"}) // the demo API's namespace plays the root namespace
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = src.Run(rctx); done <- struct{}{} }()
	go func() { _ = c.Run(rctx); done <- struct{}{} }()
	t.Cleanup(func() { stop(); <-done; <-done })

	name := gw.Name
	testkit.Eventually(t, 20*time.Second, "the east-west Deployment", func() bool {
		_, err := clients.Kube.AppsV1().Deployments("demo").Get(ctx, name, metav1.GetOptions{})
		return err == nil
	})
	dep, err := clients.Kube.AppsV1().Deployments("demo").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template
	env := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["GATEWAY_MODE"] != ModeEastWest || env["NETWORK"] != "network1" || env["GATEWAY_NAME"] != name ||
		pod.Spec.ServiceAccountName != name || pod.Labels[NetworkLabel] != "network1" {
		t.Fatalf("pod template %+v", pod)
	}
	if _, err := clients.Kube.CoreV1().ServiceAccounts("demo").Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Error(err)
	}
	svc, err := clients.Kube.CoreV1().Services("demo").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return p.Port == 15008 && p.TargetPort.IntValue() == 15008
	}) {
		t.Fatalf("service %+v, want a LoadBalancer with port 15008", svc.Spec)
	}

	gws := clients.Gateway.GatewayV1().Gateways("demo")
	status := func(addr string, want metav1.ConditionStatus, reason gatewayv1.GatewayConditionReason) func() bool {
		return func() bool {
			g, err := gws.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			if addr == "" && len(g.Status.Addresses) != 0 || addr != "" && (len(g.Status.Addresses) != 1 || g.Status.Addresses[0].Value != addr) {
				return false
			}
			return slices.ContainsFunc(g.Status.Conditions, func(c metav1.Condition) bool {
				return c.Type == string(gatewayv1.GatewayConditionProgrammed) && c.Status == want && c.Reason == string(reason)
			})
		}
	}
	testkit.Eventually(t, 20*time.Second, "no address (not the cluster IP) while the load balancer has none",
		status("", metav1.ConditionFalse, gatewayv1.GatewayReasonAddressNotAssigned))

	// No cloud here: give the load balancer an address, as its controller
	// would, and say a replica is available.
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.7"}}
	if _, err := clients.Kube.CoreV1().Services("demo").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the load balancer's address, Programmed False (no replica)",
		status("203.0.113.7", metav1.ConditionFalse, gatewayv1.GatewayReasonPending))
	dep.Status.Replicas, dep.Status.AvailableReplicas, dep.Status.ReadyReplicas = 1, 1, 1
	if _, err := clients.Kube.AppsV1().Deployments("demo").UpdateStatus(ctx, dep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "Programmed True", status("203.0.113.7", metav1.ConditionTrue, gatewayv1.GatewayReasonProgrammed))
}
