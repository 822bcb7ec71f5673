package deploy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/waypointctl"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// waypointTemplateConfigMap is the chart's ConfigMap of the template.
const waypointTemplateConfigMap = "ztunnel-go-waypoint-template"

// TestChartWaypointTemplate: the chart's waypoint Deployment template, as
// `helm template` puts it in ConfigMap ztunnel-go-waypoint-template (with
// values given on the helm command line), is what ztunnel-cp's
// --waypoint-template and --waypoint-values read through its mount;
// waypointctl's own Render turns it, for a sample Gateway, into a
// Deployment carrying those values, which a real kube-apiserver accepts
// in a server-side apply (dry run) made as ztunnel-cp's ServiceAccount
// under the chart's RBAC. waypoint.enabled=false renders neither the
// ConfigMap nor the flags.
func TestChartWaypointTemplate(t *testing.T) {
	out, err := helmTemplate(t, "--set", "waypoint.replicas=3", "--set", "waypoint.resources.limits.memory=1Gi",
		"--set", "waypoint.env[0].name=EXTRA", "--set", "waypoint.env[0].value=yes")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	objs, err := kubeapi.DecodeObjects([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	var cm *corev1.ConfigMap
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == waypointTemplateConfigMap {
			cm = &corev1.ConfigMap{}
			if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cm); err != nil {
				t.Fatal(err)
			}
		}
	}
	if cm == nil {
		t.Fatalf("no ConfigMap %s in the chart", waypointTemplateConfigMap)
	}
	cp := workloads(t, objs)[imageCP]
	if cp == nil {
		t.Fatal("no ztunnel-cp container")
	}
	flags := map[string]string{}
	for _, a := range cp.args {
		if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok {
			flags[k] = v
		}
	}
	for flag, key := range map[string]string{"waypoint-template": "deployment.yaml", "waypoint-values": "values.yaml"} {
		got, ok := configMapFile(cp, flags[flag])
		if want := waypointTemplateConfigMap + ":" + key; !ok || got != want {
			t.Errorf("--%s=%s is %q, want ConfigMap file %s", flag, flags[flag], got, want)
		}
		if cm.Data[key] == "" {
			t.Errorf("ConfigMap %s has no %s", cm.Name, key)
		}
	}
	image := flags["waypoint-image"]
	if image == "" {
		t.Fatal("ztunnel-cp has no --waypoint-image")
	}

	tmpl, err := waypointctl.ParseTemplate(flags["waypoint-template"], cm.Data["deployment.yaml"], []byte(cm.Data["values.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	dep, err := tmpl.Render(waypointctl.SampleInput("demo", "waypoint", "3c2f0d7e-0000-4000-8000-000000000001", image,
		"ztunnel-cp."+systemNamespace+".svc:15012"))
	if err != nil {
		t.Fatalf("render the chart's template: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := kubeapi.Start(t, kubeapi.Options{})
	for _, ns := range []string{systemNamespace, "demo"} {
		if err := s.EnsureNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The chart's RBAC for real, then the controller's apply as
	// ztunnel-cp's ServiceAccount.
	if err := s.Apply(ctx, []byte(out), kubeapi.ApplyOptions{}); err != nil {
		t.Fatalf("apply the chart: %v", err)
	}
	cfg := rest.CopyConfig(s.Config())
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + systemNamespace + ":ztunnel-cp"}
	asCP, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := asCP.AppsV1().Deployments("demo").Apply(ctx, dep,
		metav1.ApplyOptions{FieldManager: waypointctl.FieldManager, Force: true, DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("server-side apply (dry run) of the rendered waypoint Deployment as ztunnel-cp: %v", err)
	}
	checkWaypointDeployment(t, got, image)

	// Disabled: no template, no flags.
	off, err := helmTemplate(t, "--set", "waypoint.enabled=false")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, off)
	}
	if strings.Contains(off, waypointTemplateConfigMap) || strings.Contains(off, "--waypoint-") {
		t.Error("waypoint.enabled=false still renders the waypoint template or its flags")
	}
}

// checkWaypointDeployment: what the API server stored carries the helm
// values and what the controller enforces.
func checkWaypointDeployment(t *testing.T, d *appsv1.Deployment, image string) {
	t.Helper()
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3 (waypoint.replicas)", d.Spec.Replicas)
	}
	if o := d.OwnerReferences; len(o) != 1 || o[0].Kind != "Gateway" || o[0].Name != "waypoint" || o[0].Controller == nil || !*o[0].Controller {
		t.Errorf("owners %+v, want the Gateway as controller", o)
	}
	if m := d.Spec.Selector.MatchLabels; m[waypointctl.GatewayNameLabel] != "waypoint" {
		t.Errorf("selector %v", m)
	}
	pod := d.Spec.Template
	if pod.Labels["istio.io/dataplane-mode"] != "none" || pod.Spec.ServiceAccountName != "waypoint" || len(pod.Spec.Containers) != 1 {
		t.Fatalf("pod template %+v", pod)
	}
	c := pod.Spec.Containers[0]
	if c.Image != image || c.Resources.Limits.Memory().String() != "1Gi" || c.Resources.Requests.Cpu().IsZero() {
		t.Errorf("image %s resources %+v, want the chart's image, its requests and limits.memory 1Gi", c.Image, c.Resources)
	}
	extra := false
	for _, e := range c.Env {
		extra = extra || (e.Name == "EXTRA" && e.Value == "yes")
	}
	if !extra {
		t.Errorf("env %v lacks EXTRA=yes (waypoint.env)", c.Env)
	}
	if sc := c.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("security context %+v", c.SecurityContext)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Port.IntValue() != 15021 {
		t.Errorf("readiness probe %+v", c.ReadinessProbe)
	}
}
