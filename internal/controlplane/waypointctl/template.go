package waypointctl

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"text/template"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// Template is a user-changeable waypoint Deployment, as istiod's gateway
// deployment template: a Go text/template that renders, per Gateway, one
// apps/v1 Deployment in YAML. The chart ships it (ConfigMap
// ztunnel-go-waypoint-template) with the chart's waypoint values beside
// it. Fields a Gateway's waypoint depends on are enforced after rendering
// (Render), so a template can change resources, replicas, env, probes and
// the security context but not ownership, selection or identity.
type Template struct {
	name   string // the file, for errors
	tmpl   *template.Template
	values map[string]any
}

// TemplateInput is what a template sees: the per-Gateway parts, the
// controller's own settings and .Values (the chart's waypoint values).
type TemplateInput struct {
	// Name and Namespace of the Deployment (the Gateway's).
	Name, Namespace string
	// GatewayName is the Gateway's name (GATEWAY_NAME).
	GatewayName string
	// ServiceAccount the waypoint runs as (its identity).
	ServiceAccount string
	// Labels the Deployment and its pods carry (enforced).
	Labels map[string]string
	// SelectorLabels select the waypoint's pods (enforced).
	SelectorLabels map[string]string
	// Owner is the owner reference data (the Gateway; enforced).
	Owner OwnerInput
	// Image and PullPolicy of the waypoint container.
	Image, PullPolicy string
	// XDSAddress, CAAddress and TrustDomain the waypoint needs.
	XDSAddress, CAAddress, TrustDomain string
	// RootConfigMap is the namespace's root certificate ConfigMap.
	RootConfigMap string
	// CRLConfigMap and CRLPath, when the waypoints must enforce CRLs
	// (Config.CRLPEM), name the namespace's CRL ConfigMap (mount it at
	// CRLDir) and the CRL_PATH to set; both "" otherwise. Render refuses a
	// rendering that drops CRL_PATH while they are set.
	CRLConfigMap, CRLPath string
	// Mode is the binary's mode, ModeWaypoint or ModeEastWest (an
	// istio-east-west Gateway), and Network an east-west gateway's
	// network. Render enforces GATEWAY_MODE and NETWORK for east-west on
	// the proxy container, so a waypoint template serves both.
	Mode, Network string
	// Values are the chart's waypoint values (the values file).
	Values map[string]any
}

// OwnerInput is the Gateway as owner.
type OwnerInput struct {
	APIVersion, Kind, Name, UID string
}

// LoadTemplate reads a template file and its values file (YAML; "" for
// none).
func LoadTemplate(file, valuesFile string) (*Template, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("waypoint template %s: %w", file, err)
	}
	var values []byte
	if valuesFile != "" {
		if values, err = os.ReadFile(valuesFile); err != nil {
			return nil, fmt.Errorf("waypoint template values %s: %w", valuesFile, err)
		}
	}
	return ParseTemplate(file, string(text), values)
}

// ParseTemplate parses a template's text and its values (YAML) under name
// (the file, which errors name). A key the template reads that is missing
// from the values is an error when rendering, not an empty string.
func ParseTemplate(name, text string, values []byte) (*Template, error) {
	t, err := template.New(name).Option("missingkey=error").Funcs(templateFuncs).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("waypoint template %s: %w", name, err)
	}
	v := map[string]any{}
	if len(bytes.TrimSpace(values)) > 0 {
		if err := yaml.Unmarshal(values, &v); err != nil {
			return nil, fmt.Errorf("waypoint template %s: values: %w", name, err)
		}
	}
	return &Template{name: name, tmpl: t, values: v}, nil
}

// Name is the template's file.
func (t *Template) Name() string { return t.name }

var templateFuncs = template.FuncMap{
	"toYaml": func(v any) (string, error) {
		b, err := yaml.Marshal(v)
		return strings.TrimSuffix(string(b), "\n"), err
	},
	"indent": func(n int, s string) string {
		pad := strings.Repeat(" ", n)
		return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
	},
	"nindent": func(n int, s string) string {
		pad := strings.Repeat(" ", n)
		return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
	},
	"quote": func(v any) string { return fmt.Sprintf("%q", fmt.Sprint(v)) },
}

// Render renders t for one waypoint and enforces what the controller
// depends on: name and namespace, the labels (ours win over the
// template's), the Gateway as sole owner, the selector, the pod labels
// (ours, and excluded from capture) and the service account. What fails to
// render, decode strictly as an apps/v1 Deployment, or lacks a pod
// template with a container is an error naming the file.
func (t *Template) Render(in TemplateInput) (*appsv1ac.DeploymentApplyConfiguration, error) {
	in.Values = t.values
	var buf bytes.Buffer
	if err := t.tmpl.Execute(&buf, in); err != nil {
		return nil, fmt.Errorf("waypoint template %s: %w", t.name, err)
	}
	// One document: a second one (another object) would be dropped.
	if docs := slices.DeleteFunc(documentSeparator.Split(buf.String(), -1), isBlankYAML); len(docs) > 1 {
		return nil, fmt.Errorf("waypoint template %s: rendered %d YAML documents, want one Deployment", t.name, len(docs))
	}
	// Strictly into the API type first: an unknown field or a wrong type
	// is refused here rather than dropped.
	var typed appsv1.Deployment
	if err := yaml.UnmarshalStrict(buf.Bytes(), &typed); err != nil {
		return nil, fmt.Errorf("waypoint template %s: rendered YAML is not a Deployment: %w", t.name, err)
	}
	if typed.APIVersion != "apps/v1" || typed.Kind != "Deployment" {
		return nil, fmt.Errorf("waypoint template %s: rendered %s %s, want apps/v1 Deployment", t.name, typed.APIVersion, typed.Kind)
	}
	if len(typed.Spec.Template.Spec.Containers) == 0 {
		return nil, fmt.Errorf("waypoint template %s: the Deployment has no containers", t.name)
	}
	if in.CRLPath != "" && !setsEnv(typed.Spec.Template.Spec.Containers, "CRL_PATH", in.CRLPath) {
		// Fail closed: a waypoint without the CRLs would let revoked
		// workloads through to every service behind it.
		return nil, fmt.Errorf("waypoint template %s: the waypoint must enforce CRLs, but no container sets CRL_PATH=%s (mount ConfigMap .CRLConfigMap at %s)",
			t.name, in.CRLPath, CRLDir)
	}
	// The apply configuration holds only what the template set, so the
	// controller owns those fields and no zero values.
	dep := &appsv1ac.DeploymentApplyConfiguration{}
	if err := yaml.Unmarshal(buf.Bytes(), dep); err != nil {
		return nil, fmt.Errorf("waypoint template %s: %w", t.name, err)
	}
	dep.WithName(in.Name).WithNamespace(in.Namespace).WithLabels(in.Labels)
	dep.OwnerReferences = nil
	dep.WithOwnerReferences(metav1ac.OwnerReference().WithAPIVersion(in.Owner.APIVersion).WithKind(in.Owner.Kind).
		WithName(in.Owner.Name).WithUID(types.UID(in.Owner.UID)).WithController(true).WithBlockOwnerDeletion(true))
	spec := dep.Spec // non-nil: it has containers
	spec.WithSelector(metav1ac.LabelSelector().WithMatchLabels(in.SelectorLabels))
	spec.Template.WithLabels(in.Labels).WithLabels(map[string]string{"istio.io/dataplane-mode": "none"})
	spec.Template.Spec.WithServiceAccountName(in.ServiceAccount)
	if in.Mode == ModeEastWest {
		// Without these the pod would be a waypoint serving east-west
		// traffic it has no config for; set, not required, as the labels.
		setEnv(spec.Template.Spec, "GATEWAY_MODE", ModeEastWest)
		setEnv(spec.Template.Spec, "NETWORK", in.Network)
	}
	return dep, nil
}

// setEnv sets env name to value on the proxy container (ProxyContainer,
// else the first), replacing what the template set.
func setEnv(pod *corev1ac.PodSpecApplyConfiguration, name, value string) {
	i := slices.IndexFunc(pod.Containers, func(c corev1ac.ContainerApplyConfiguration) bool {
		return c.Name != nil && *c.Name == ProxyContainer
	})
	c := &pod.Containers[max(i, 0)]
	c.Env = slices.DeleteFunc(c.Env, func(e corev1ac.EnvVarApplyConfiguration) bool { return e.Name != nil && *e.Name == name })
	c.WithEnv(corev1ac.EnvVar().WithName(name).WithValue(value))
}

// setsEnv: some container sets env name to value.
func setsEnv(cs []corev1.Container, name, value string) bool {
	for _, c := range cs {
		for _, e := range c.Env {
			if e.Name == name && e.Value == value && e.ValueFrom == nil {
				return true
			}
		}
	}
	return false
}

var documentSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// isBlankYAML: only whitespace and comments.
func isBlankYAML(doc string) bool {
	for _, l := range strings.Split(doc, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// input is the template input for gw.
func (c *Controller) input(gw *gatewayv1.Gateway) TemplateInput {
	in := TemplateInput{
		Name: gw.Name, Namespace: gw.Namespace, GatewayName: gw.Name, ServiceAccount: gw.Name,
		Labels: waypointLabels(gw), SelectorLabels: map[string]string{GatewayNameLabel: gw.Name},
		Owner: OwnerInput{APIVersion: gatewayv1.GroupVersion.String(), Kind: "Gateway", Name: gw.Name, UID: string(gw.UID)},
		Image: c.cfg.Image, PullPolicy: string(c.cfg.PullPolicy),
		XDSAddress: c.cfg.XDSAddress, CAAddress: c.cfg.CAAddress, TrustDomain: c.cfg.TrustDomain,
		RootConfigMap: RootConfigMap, Mode: mode(gw),
	}
	if eastWest(gw) {
		in.Network = gw.Labels[NetworkLabel]
	}
	if c.cfg.CRLPEM != nil {
		in.CRLConfigMap, in.CRLPath = CRLConfigMap, CRLDir+"/"+CRLKey
	}
	return in
}

// SampleInput is a TemplateInput for a Gateway namespace/name with the
// controller's defaults, for checking a template outside the controller
// (deploy's tests render the chart's).
func SampleInput(namespace, name, uid, image, xdsAddress string) TemplateInput {
	c := &Controller{cfg: Config{Image: image, PullPolicy: corev1.PullIfNotPresent, XDSAddress: xdsAddress, CAAddress: xdsAddress, TrustDomain: "cluster.local"}}
	gw := &gatewayv1.Gateway{}
	gw.Namespace, gw.Name, gw.UID = namespace, name, types.UID(uid)
	return c.input(gw)
}
