package waypointctl

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestControllerTemplateOnAPIServer: with a template file the waypoint's
// Deployment is the rendered one (its values applied, ownership and
// selection enforced); the file is re-read on every reconcile, and once it
// no longer renders the Gateway goes Programmed=False, reason Invalid,
// with a message naming the file and the Gateway, its address kept (the
// traffic bound to it fails rather than bypasses it).
func TestControllerTemplateOnAPIServer(t *testing.T) {
	ctx, clients, mkGateway := demoAPI(t, 90*time.Second)
	gws := clients.Gateway.GatewayV1().Gateways("demo")
	mkGateway("waypoint", nil)

	dir := t.TempDir()
	file, values := filepath.Join(dir, "deployment.yaml"), filepath.Join(dir, "values.yaml")
	good, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "chart", "ztunnel-go", "files", "waypoint-deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(file, string(good))
	write(values, `replicas: 2
resources: {requests: {cpu: 250m}}
env: [{name: EXTRA, value: "yes"}]
readinessProbe: {httpGet: {path: /healthz/ready, port: 15021}, periodSeconds: 5}
securityContext: {runAsNonRoot: true, runAsUser: 1337}
terminationGracePeriodSeconds: 10
podAnnotations: {}
nodeSelector: {}
tolerations: []
`)

	src, err := kube.New(kube.Config{Clients: clients, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = src.Run(rctx); done <- struct{}{} }()
	c, err := New(Config{
		Kube: clients.Kube, Gateway: clients.Gateway, Source: src,
		Image: "registry.example/waypoint:0.2.0", XDSAddress: "ztunnel-cp.istio-system.svc:15012",
		TemplateFile: file, ValuesFile: values, Resync: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(rctx); done <- struct{}{} }()
	t.Cleanup(func() { stop(); <-done; <-done })

	var dep *appsv1.Deployment
	testkit.Eventually(t, 20*time.Second, "the rendered waypoint Deployment", func() bool {
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
	if m := dep.Spec.Selector.MatchLabels; m[GatewayNameLabel] != "waypoint" {
		t.Errorf("selector %v", m)
	}
	pod := dep.Spec.Template.Spec
	ctr := pod.Containers[0]
	if *dep.Spec.Replicas != 2 || ctr.Resources.Requests.Cpu().String() != "250m" || ctr.ReadinessProbe.PeriodSeconds != 5 ||
		*pod.TerminationGracePeriodSeconds != 10 || ctr.Image != "registry.example/waypoint:0.2.0" || pod.ServiceAccountName != "waypoint" {
		t.Errorf("values not applied: replicas %d, container %+v", *dep.Spec.Replicas, ctr)
	}
	if !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "EXTRA" && e.Value == "yes" }) {
		t.Errorf("env %v lacks EXTRA", ctr.Env)
	}

	// The template breaks: the status says so (file and Gateway named),
	// the address stays.
	write(file, strings.Replace(string(good), "{{ .Values.replicas }}", "{{ .Values.nosuch }}", 1))
	testkit.Eventually(t, 20*time.Second, "Programmed False, Invalid, naming the template and the Gateway", func() bool {
		gw, err := gws.Get(ctx, "waypoint", metav1.GetOptions{})
		if err != nil || len(gw.Status.Addresses) != 1 {
			return false
		}
		return slices.ContainsFunc(gw.Status.Conditions, func(c metav1.Condition) bool {
			return c.Type == string(gatewayv1.GatewayConditionProgrammed) && c.Status == metav1.ConditionFalse &&
				c.Reason == string(gatewayv1.GatewayReasonInvalid) && strings.Contains(c.Message, file) && strings.Contains(c.Message, "demo/waypoint")
		})
	})
	objs, _ := src.Current()
	if failed := c.Reconcile(ctx, objs); failed != 1 {
		t.Errorf("Reconcile with a broken template: %d failed, want 1", failed)
	}
}
