package waypointctl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// chartTemplate parses the chart's waypoint template with the chart's
// waypoint values, as the ConfigMap carries them.
func chartTemplate(t *testing.T, override func(map[string]any)) *Template {
	t.Helper()
	chart := filepath.Join("..", "..", "..", "deploy", "chart", "ztunnel-go")
	text, err := os.ReadFile(filepath.Join(chart, "files", "waypoint-deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var all map[string]any
	if err := yaml.Unmarshal(raw, &all); err != nil {
		t.Fatal(err)
	}
	wp, _ := all["waypoint"].(map[string]any)
	if override != nil {
		override(wp)
	}
	values, err := yaml.Marshal(wp)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := ParseTemplate("waypoint-deployment.yaml", string(text), values)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

// TestRenderChartTemplate: the chart's template renders, for a Gateway,
// the Deployment the built-in one is (image, identity, env, token, root,
// probe, security context), with the chart's values flowing through
// (replicas, resources, extra env, node selector).
func TestRenderChartTemplate(t *testing.T) {
	tmpl := chartTemplate(t, func(v map[string]any) {
		v["replicas"] = 3
		v["resources"] = map[string]any{"limits": map[string]any{"memory": "1Gi"}}
		v["env"] = []any{map[string]any{"name": "EXTRA", "value": "yes"}}
		v["nodeSelector"] = map[string]any{"pool": "edge"}
	})
	in := SampleInput("demo", "waypoint", "0f0e-uid", "registry.example/waypoint:1", "ztunnel-cp.istio-system.svc:15012")
	dep, err := tmpl.Render(in)
	if err != nil {
		t.Fatal(err)
	}
	if *dep.Name != "waypoint" || *dep.Namespace != "demo" || *dep.Spec.Replicas != 3 {
		t.Fatalf("name %s/%s replicas %d", *dep.Namespace, *dep.Name, *dep.Spec.Replicas)
	}
	pod := dep.Spec.Template.Spec
	if *pod.ServiceAccountName != "waypoint" || pod.NodeSelector["pool"] != "edge" || len(pod.Containers) != 1 {
		t.Fatalf("pod spec %+v", pod)
	}
	c := pod.Containers[0]
	if *c.Image != "registry.example/waypoint:1" || c.Resources.Limits.Memory().String() != "1Gi" {
		t.Errorf("image %s resources %+v", *c.Image, c.Resources)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.Value != nil:
			env[*e.Name] = *e.Value
		case e.ValueFrom != nil:
			env[*e.Name] = *e.ValueFrom.FieldRef.FieldPath
		}
	}
	for k, v := range map[string]string{"GATEWAY_NAME": "waypoint", "XDS_ADDRESS": "ztunnel-cp.istio-system.svc:15012",
		"CA_ADDRESS": "ztunnel-cp.istio-system.svc:15012", "TRUST_DOMAIN": "cluster.local", "INSTANCE_IP": "status.podIP", "EXTRA": "yes"} {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	if *c.ReadinessProbe.HTTPGet.Path != "/healthz/ready" || *c.SecurityContext.RunAsUser != 1337 || !*c.SecurityContext.RunAsNonRoot {
		t.Errorf("probe %+v security %+v", c.ReadinessProbe, c.SecurityContext)
	}
	if a := *pod.Volumes[0].Projected.Sources[0].ServiceAccountToken.Audience; a != "istio-ca" {
		t.Errorf("token audience %q", a)
	}
	if o := dep.OwnerReferences; len(o) != 1 || *o[0].Kind != "Gateway" || string(*o[0].UID) != "0f0e-uid" || !*o[0].Controller {
		t.Errorf("owners %+v", o)
	}
	if l := dep.Spec.Template.Labels; l["istio.io/dataplane-mode"] != "none" || l[GatewayNameLabel] != "waypoint" {
		t.Errorf("pod labels %v", l)
	}
	// What Istio's tools recognise a waypoint by: istioctl analyze skips the
	// istio-proxy container's UID 1337 and the managed objects.
	if *c.Name != ProxyContainer || dep.Labels[ManagedLabel] != ManagedMeshController || dep.Spec.Template.Labels[ManagedLabel] != ManagedMeshController {
		t.Errorf("container %q, labels %v / pod %v: want %s and %s=%s", *c.Name, dep.Labels, dep.Spec.Template.Labels, ProxyContainer, ManagedLabel, ManagedMeshController)
	}
}

// TestRenderEnforces: what a template sets for ownership, selection and
// identity is overridden by the controller's.
func TestRenderEnforces(t *testing.T) {
	text := `apiVersion: apps/v1
kind: Deployment
metadata:
  name: other
  namespace: kube-system
  labels: {gateway.networking.k8s.io/gateway-name: someone-else, team: a}
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: x, uid: "1"}
spec:
  replicas: {{ .Values.replicas }}
  selector: {matchLabels: {app: everything}}
  template:
    metadata:
      labels: {app: everything, istio.io/dataplane-mode: ambient}
    spec:
      serviceAccountName: cluster-admin
      containers: [{name: waypoint, image: "{{ .Image }}"}]
`
	tmpl, err := ParseTemplate("t.yaml", "# a comment\n---\n"+text+"---\n", []byte("replicas: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	dep, err := tmpl.Render(SampleInput("demo", "wp", "u1", "img", "cp:15012"))
	if err != nil {
		t.Fatal(err)
	}
	if *dep.Name != "wp" || *dep.Namespace != "demo" || *dep.Spec.Replicas != 2 {
		t.Errorf("name %s/%s replicas %d", *dep.Namespace, *dep.Name, *dep.Spec.Replicas)
	}
	if dep.Labels[GatewayNameLabel] != "wp" || dep.Labels["team"] != "a" {
		t.Errorf("labels %v (ours win, the template's others stay)", dep.Labels)
	}
	if o := dep.OwnerReferences; len(o) != 1 || *o[0].Kind != "Gateway" || *o[0].Name != "wp" || string(*o[0].UID) != "u1" {
		t.Errorf("owners %+v, want only the Gateway", o)
	}
	if m := dep.Spec.Selector.MatchLabels; len(m) != 1 || m[GatewayNameLabel] != "wp" {
		t.Errorf("selector %v", m)
	}
	if l := dep.Spec.Template.Labels; l[GatewayNameLabel] != "wp" || l["istio.io/dataplane-mode"] != "none" {
		t.Errorf("pod labels %v", l)
	}
	if sa := *dep.Spec.Template.Spec.ServiceAccountName; sa != "wp" {
		t.Errorf("service account %q", sa)
	}
}

// TestRenderRefuses: a template that does not parse, reads a value that
// is not there, renders another kind, has an unknown field or no
// container is an error naming the file.
func TestRenderRefuses(t *testing.T) {
	const dep = "apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers: [{name: w, image: i}]\n"
	if _, err := ParseTemplate("bad.yaml", "kind: {{ .Name", nil); err == nil || !strings.Contains(err.Error(), "bad.yaml") {
		t.Errorf("unparseable: %v", err)
	}
	if _, err := ParseTemplate("bad.yaml", dep, []byte("[not a map")); err == nil || !strings.Contains(err.Error(), "values") {
		t.Errorf("bad values: %v", err)
	}
	for name, text := range map[string]string{
		"missing value": dep + "  replicas: {{ .Values.replicas }}\n",
		"other kind":    "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n",
		"unknown field": dep + "  replica: 2\n",
		"wrong type":    dep + "  replicas: two\n",
		"no container":  "apiVersion: apps/v1\nkind: Deployment\nspec: {replicas: 1}\n",
		"not YAML":      "{{ .Name }}: [\n",
		"two documents": dep + "---\napiVersion: v1\nkind: Secret\nmetadata: {name: x}\n",
	} {
		tmpl, err := ParseTemplate("t.yaml", text, nil)
		if err != nil {
			t.Fatalf("%s: parse: %v", name, err)
		}
		if _, err := tmpl.Render(SampleInput("demo", "wp", "u", "img", "cp:15012")); err == nil || !strings.Contains(err.Error(), "waypoint template t.yaml") {
			t.Errorf("%s: err = %v, want an error naming the file", name, err)
		}
	}
	if _, err := LoadTemplate(filepath.Join(t.TempDir(), "absent.yaml"), ""); err == nil || !strings.Contains(err.Error(), "absent.yaml") {
		t.Errorf("absent file: %v", err)
	}
}

// TestRenderCRL: when the waypoints must enforce CRLs, the chart's
// template sets CRL_PATH and mounts the namespace's CRL ConfigMap; a
// template that does not set CRL_PATH is refused (a waypoint without the
// CRLs would let revoked workloads through), and without CRLs none of it
// is rendered.
func TestRenderCRL(t *testing.T) {
	tmpl := chartTemplate(t, nil)
	in := SampleInput("demo", "waypoint", "u", "img", "cp:15012")
	plain, err := tmpl.Render(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range plain.Spec.Template.Spec.Containers[0].Env {
		if *e.Name == "CRL_PATH" {
			t.Fatal("CRL_PATH rendered without CRLs")
		}
	}
	in.CRLConfigMap, in.CRLPath = CRLConfigMap, CRLDir+"/"+CRLKey
	dep, err := tmpl.Render(in)
	if err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	var env, mount, volume bool
	for _, e := range c.Env {
		env = env || (*e.Name == "CRL_PATH" && *e.Value == "/var/run/secrets/istio-crl/ca-crl.pem")
	}
	for _, m := range c.VolumeMounts {
		mount = mount || (*m.Name == "istio-ca-crl" && *m.MountPath == CRLDir)
	}
	for _, v := range pod.Volumes {
		volume = volume || (*v.Name == "istio-ca-crl" && v.ConfigMap != nil && *v.ConfigMap.Name == CRLConfigMap)
	}
	if !env || !mount || !volume {
		t.Errorf("with CRLs: CRL_PATH %v, mount %v, volume %v; want all", env, mount, volume)
	}
	bare, err := ParseTemplate("t.yaml", "apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers: [{name: w, image: i}]\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Render(in); err == nil || !strings.Contains(err.Error(), "CRL_PATH") {
		t.Errorf("a template without CRL_PATH while CRLs are enforced: %v, want refused", err)
	}
}
