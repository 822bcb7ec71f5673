package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// TestWaypointCommands: zctl waypoint apply creates a waypoint Gateway and
// enrolls the namespace, list shows it Programmed with its address once the
// control plane says so (set here as the controller would), apply refuses
// to take over a Gateway of another class, and delete removes the Gateway
// and the namespace label that named it.
func TestWaypointCommands(t *testing.T) {
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := api.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	if err := api.EnsureNamespace(ctx, "demo", nil); err != nil {
		t.Fatal(err)
	}
	zctl := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(append(append([]string{"waypoint"}, args...), "--kubeconfig", api.Kubeconfig()), &out, &out)
		return out.String(), err
	}
	if out, err := zctl("apply", "-n", "demo", "--enroll-namespace", "--for", "workload"); err != nil || !strings.Contains(out, "waypoint demo/waypoint created") {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	gc, err := gatewayclient.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gc.GatewayV1().Gateways("demo").Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil || gw.Spec.GatewayClassName != waypointClass || gw.Labels[labelWaypointFor] != "workload" || gw.Spec.Listeners[0].Port != 15008 {
		t.Fatalf("Gateway = %+v, %v", gw, err)
	}
	ns, err := api.Client().CoreV1().Namespaces().Get(ctx, "demo", metav1.GetOptions{})
	if err != nil || ns.Labels[labelUseWaypoint] != "waypoint" {
		t.Fatalf("namespace labels = %v, %v", ns.Labels, err)
	}
	if out, _ := zctl("list", "-n", "demo"); !strings.Contains(out, "demo       waypoint  workload  -        Unknown") {
		t.Errorf("list before the control plane programmed it:\n%s", out)
	}
	gw.Status.Addresses = []gatewayv1.GatewayStatusAddress{{Type: new(gatewayv1.IPAddressType), Value: "10.96.7.7"}}
	*gw.Status.Addresses[0].Type = gatewayv1.IPAddressType
	gw.Status.Conditions = []metav1.Condition{{Type: "Programmed", Status: metav1.ConditionTrue, Reason: "Programmed", Message: "1 waypoint replica(s) available", LastTransitionTime: metav1.Now()}}
	if _, err := gc.GatewayV1().Gateways("demo").UpdateStatus(ctx, gw, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := zctl("apply", "-n", "demo", "--for", "workload", "--wait"); err != nil || !strings.Contains(out, "programmed at 10.96.7.7") {
		t.Fatalf("apply --wait: %v\n%s", err, out)
	}
	out, err := zctl("status", "-n", "demo")
	if err != nil || !strings.Contains(out, "10.96.7.7") || !strings.Contains(out, "Programmed=True (Programmed): 1 waypoint replica(s) available") {
		t.Errorf("status: %v\n%s", err, out)
	}
	if out, err := zctl("list", "-A", "-o", "json"); err != nil || !strings.Contains(out, `"programmed": "True"`) {
		t.Errorf("list -A -o json: %v\n%s", err, out)
	}

	if _, err := gc.GatewayV1().Gateways("demo").Create(ctx, &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "ingress"},
		Spec:       gatewayv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gatewayv1.Listener{{Name: "http", Port: 80, Protocol: "HTTP"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := zctl("apply", "-n", "demo", "--name", "ingress"); err == nil || !strings.Contains(err.Error(), "not a waypoint") {
		t.Errorf("apply over an ingress Gateway: %v", err)
	}
	if _, err := zctl("delete", "-n", "demo", "ingress"); err == nil {
		t.Error("delete removed a Gateway that is not a waypoint")
	}
	if out, err := zctl("delete", "-n", "demo", "waypoint"); err != nil || !strings.Contains(out, "label istio.io/use-waypoint removed") {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	if ns, _ := api.Client().CoreV1().Namespaces().Get(ctx, "demo", metav1.GetOptions{}); ns.Labels[labelUseWaypoint] != "" {
		t.Errorf("namespace still labelled %v", ns.Labels)
	}
	if out, _ := zctl("list", "-n", "demo"); strings.Contains(out, "waypoint  ") {
		t.Errorf("list after delete:\n%s", out)
	}
}
