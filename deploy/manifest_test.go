package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/webhook"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Our images, by repository base name (values.yaml's ztunnel.image,
// cni.image, controlPlane.image), and the command each runs.
const (
	imageZtunnel = "ztunnel"
	imageCNI     = "ztunnel-cni"
	imageCP      = "ztunnel-cp"
)

// cpSummary and cniSummary are what `ztunnel-cp --check-flags` and
// `ztunnel-cni --check-flags` print (the fields this test reads).
type cpSummary struct {
	Mode                string   `json:"mode"`
	Listen              string   `json:"listen"`
	Admin               string   `json:"admin"`
	MetricsAddr         string   `json:"metrics_addr"`
	ReadinessAddr       string   `json:"readiness_addr"`
	ReadinessPath       string   `json:"readiness_path"`
	ServingNames        []string `json:"serving_names"`
	RootConfigMap       string   `json:"root_configmap"`
	RootConfigMapKey    string   `json:"root_configmap_key"`
	TrustedNodeAccounts []string `json:"trusted_node_accounts"`
	Lease               string   `json:"lease"`
	WebhookAddr         string   `json:"webhook_addr"`
}

type cniSummary struct {
	Mode             string `json:"mode"`
	AdminAddr        string `json:"admin_addr"`
	ReadinessAddr    string `json:"readiness_addr"`
	ReadinessPath    string `json:"readiness_path"`
	ZDSSocket        string `json:"zds_socket"`
	PluginSocket     string `json:"plugin_socket"`
	StateDir         string `json:"state_dir"`
	CNIBinDir        string `json:"cni_bin_dir"`
	CNIConfDir       string `json:"cni_conf_dir"`
	HostRoot         string `json:"host_root"`
	PluginKubeconfig string `json:"plugin_kubeconfig"`
}

// workload is one container of the manifests with its pod.
type workload struct {
	kind, name, namespace string
	labels                map[string]string // the pod template's
	pod                   corev1.PodSpec
	c                     corev1.Container
	env                   map[string]string // resolved as the kubelet would, with dummy downward-API values
	args                  []string          // with $(VAR) expanded
}

// TestManifestMatchesBinaries runs the real binaries' flag parsing
// (--check-flags) on the arguments and environment the rendered manifests
// give each container, and internal/node/config's parsing on the node proxy's
// environment, then checks that what they amount to fits the rest of the
// manifests: probes hit the port and path the binary serves, the node proxy
// dials a Service name the control plane's certificate covers and mounts the
// ConfigMap it publishes, sockets and the plugin's kubeconfig sit on shared
// host paths, and RBAC grants the Lease and ConfigMap the binary uses.
// A flag the chart passes that a binary lacks fails here, not in a
// crash-looping pod.
func TestManifestMatchesBinaries(t *testing.T) {
	data, err := os.ReadFile(manifests)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubeapi.DecodeObjects(data)
	if err != nil {
		t.Fatal(err)
	}
	ws := workloads(t, objs)
	for _, img := range []string{imageZtunnel, imageCNI, imageCP} {
		if ws[img] == nil {
			t.Fatalf("no container runs image %s", img)
		}
	}
	bin := testkit.BuildBinaries(t, t.TempDir(), imageCNI, imageCP)

	var cp cpSummary
	checkFlags(t, filepath.Join(bin, imageCP), ws[imageCP], &cp)
	var cni cniSummary
	checkFlags(t, filepath.Join(bin, imageCNI), ws[imageCNI], &cni)
	zt := ws[imageZtunnel]
	cfg := ztunnelConfig(t, zt)
	if t.Failed() {
		return
	}

	cpw, cniw := ws[imageCP], ws[imageCNI]
	t.Run("control plane", func(t *testing.T) {
		if cp.Mode != "kubernetes" {
			t.Errorf("ztunnel-cp runs in %s mode, want kubernetes", cp.Mode)
		}
		checkProbes(t, cpw, cp.ReadinessAddr, cp.ReadinessPath)
		for _, addr := range []string{cp.Listen, cp.MetricsAddr, cp.ReadinessAddr, cp.WebhookAddr} {
			if addr != "" && !hasContainerPort(cpw.c, port(t, addr)) {
				t.Errorf("ztunnel-cp listens on %s, not a declared container port", addr)
			}
		}
		checkDebugPrivate(t, objs, cpw, cp.Admin, cp.Listen, cp.MetricsAddr, cp.ReadinessAddr, cp.WebhookAddr)
		checkWebhook(t, objs, cpw, cp)
		if want := zt.namespace + "/" + zt.pod.ServiceAccountName; !slices.Contains(cp.TrustedNodeAccounts, want) {
			t.Errorf("trusted node accounts %v lack the node proxy's %s", cp.TrustedNodeAccounts, want)
		}
		leaseNs, leaseName, _ := strings.Cut(cp.Lease, "/")
		cmNs, cmName, _ := strings.Cut(cp.RootConfigMap, "/")
		sa := cpw.namespace + "/" + cpw.pod.ServiceAccountName
		for _, g := range []struct{ ns, group, resource, name, verb string }{
			{leaseNs, "coordination.k8s.io", "leases", "", "create"},
			{leaseNs, "coordination.k8s.io", "leases", leaseName, "get"},
			{leaseNs, "coordination.k8s.io", "leases", leaseName, "update"},
			{cmNs, "", "configmaps", "", "create"},
			{cmNs, "", "configmaps", cmName, "get"},
			{cmNs, "", "configmaps", cmName, "update"},
			{"app", "", "pods", "", "list"}, // the CA's live placement check
			{"", "authentication.k8s.io", "tokenreviews", "", "create"},
			{"", "admissionregistration.k8s.io", "validatingwebhookconfigurations", webhook.ConfigurationName, "get"},
			{"", "admissionregistration.k8s.io", "validatingwebhookconfigurations", webhook.ConfigurationName, "update"},
		} {
			if !grants(t, objs, sa, g.ns, g.group, g.resource, g.name, g.verb) {
				t.Errorf("RBAC does not let %s %s %s/%s %q in %q", sa, g.verb, g.group, g.resource, g.name, g.ns)
			}
		}
	})

	t.Run("node proxy", func(t *testing.T) {
		checkProbes(t, zt, cfg.ReadinessAddr, daemon.ReadyPath)
		if !hasContainerPort(zt.c, port(t, cfg.ReadinessAddr)) {
			t.Errorf("READINESS_ADDR %s is not a declared container port", cfg.ReadinessAddr)
		}
		checkDebugPrivate(t, objs, zt, cfg.AdminAddr, cfg.StatsAddr, cfg.ReadinessAddr)
		// The control plane's Service, by name, on the port the CA and xDS listen on.
		for name, addr := range map[string]string{config.EnvXDSAddress: cfg.XDSAddress, config.EnvCAAddress: cfg.CAAddress} {
			host, p, err := net.SplitHostPort(addr)
			if err != nil {
				t.Errorf("%s=%q: %v", name, addr, err)
				continue
			}
			if !slices.Contains(cp.ServingNames, host) {
				t.Errorf("%s host %s is not in the control plane's serving certificate %v", name, host, cp.ServingNames)
			}
			if !serviceReaches(t, objs, host, p, cpw, port(t, cp.Listen)) {
				t.Errorf("%s=%s: no Service of that name and port forwards to ztunnel-cp's --listen %s", name, addr, cp.Listen)
			}
		}
		// The root certificate: the ConfigMap the control plane publishes, at the key it writes.
		cmNs, cmName, _ := strings.Cut(cp.RootConfigMap, "/")
		if cmNs != zt.namespace {
			t.Errorf("root ConfigMap published in %s, node proxy runs in %s", cmNs, zt.namespace)
		}
		for name, file := range map[string]string{config.EnvXDSRootCA: cfg.XDSRootCA, config.EnvCARootCA: cfg.CARootCA} {
			if got, ok := configMapFile(zt, file); !ok || got != cmName+":"+cp.RootConfigMapKey {
				t.Errorf("%s=%s is ConfigMap file %q, want %s:%s", name, file, got, cmName, cp.RootConfigMapKey)
			}
		}
		if cfg.AuthToken == "" || !projectedToken(zt, cfg.AuthToken, "istio-ca") {
			t.Errorf("AUTH_TOKEN=%s is not a projected ServiceAccount token with audience istio-ca", cfg.AuthToken)
		}
	})

	t.Run("node agent", func(t *testing.T) {
		if cni.Mode != "kubernetes" {
			t.Errorf("ztunnel-cni runs in %s mode, want kubernetes", cni.Mode)
		}
		checkProbes(t, cniw, cni.ReadinessAddr, cni.ReadinessPath)
		if !hasContainerPort(cniw.c, port(t, cni.ReadinessAddr)) {
			t.Errorf("--readiness-addr %s is not a declared container port", cni.ReadinessAddr)
		}
		checkDebugPrivate(t, objs, cniw, cni.AdminAddr, cni.ReadinessAddr)
		// The ZDS socket: the same host file for both.
		agentHost, ok1 := hostPath(cniw, cni.ZDSSocket)
		proxyHost, ok2 := hostPath(zt, cfg.InpodUDS)
		if !ok1 || !ok2 || agentHost != proxyHost {
			t.Errorf("ZDS socket: agent %s (host %q), proxy INPOD_UDS %s (host %q): want one host path", cni.ZDSSocket, agentHost, cfg.InpodUDS, proxyHost)
		}
		// The plugin runs on the host with the agent's paths: its socket
		// and kubeconfig must be where the host sees them at the same path.
		for what, p := range map[string]string{"plugin socket": cni.PluginSocket, "plugin kubeconfig": cni.PluginKubeconfig} {
			if h, ok := hostPath(cniw, p); !ok || h != p {
				t.Errorf("%s %s is host path %q, want the same path on the host", what, p, h)
			}
		}
		if _, ok := hostPath(cniw, cni.StateDir); !ok {
			t.Errorf("state dir %s is not on a host path", cni.StateDir)
		}
		// The CNI directories (host paths, the runtime's by default) and
		// the runtime's configuration are reached under --host-root: it
		// must be the host's root itself.
		if h, ok := hostPath(cniw, cni.HostRoot); cni.HostRoot == "" || !ok || h != "/" {
			t.Errorf("--host-root %q is host path %q, want the host's /", cni.HostRoot, h)
		}
		if cni.CNIBinDir != "" || cni.CNIConfDir != "" {
			t.Errorf("default values set CNI dirs %q %q; want them read from the runtime's configuration", cni.CNIBinDir, cni.CNIConfDir)
		}
	})
}

// workloads collects the containers of every DaemonSet and Deployment by
// image base name; a container of an image this test does not know fails.
func workloads(t *testing.T, objs []*unstructured.Unstructured) map[string]*workload {
	t.Helper()
	out := map[string]*workload{}
	for _, o := range objs {
		var (
			tmpl corev1.PodTemplateSpec
			err  error
		)
		switch o.GetKind() {
		case "DaemonSet":
			var d appsv1.DaemonSet
			err = k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d)
			tmpl = d.Spec.Template
		case "Deployment":
			var d appsv1.Deployment
			err = k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d)
			tmpl = d.Spec.Template
		case "StatefulSet", "Job", "CronJob", "Pod", "ReplicaSet":
			t.Fatalf("%s %s: this test does not know that kind yet", o.GetKind(), o.GetName())
		default:
			continue
		}
		if err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
		for _, c := range append(slices.Clone(tmpl.Spec.InitContainers), tmpl.Spec.Containers...) {
			img := c.Image
			if i := strings.LastIndex(img, "@"); i >= 0 {
				img = img[:i]
			}
			if i := strings.LastIndex(img, ":"); i > strings.LastIndex(img, "/") {
				img = img[:i]
			}
			img = path.Base(img)
			if img != imageZtunnel && img != imageCNI && img != imageCP {
				t.Fatalf("%s %s container %s: image %s is none of ours; teach this test what it runs", o.GetKind(), o.GetName(), c.Name, c.Image)
			}
			if out[img] != nil {
				t.Fatalf("image %s runs in two containers; this test expects one", img)
			}
			if len(c.Command) > 0 {
				t.Errorf("%s: command %q overrides the image's entrypoint (the binary)", c.Name, c.Command)
			}
			w := &workload{kind: o.GetKind(), name: o.GetName(), namespace: o.GetNamespace(), labels: tmpl.Labels, pod: tmpl.Spec, c: c}
			w.env = resolveEnv(t, w)
			for _, a := range c.Args {
				w.args = append(w.args, expand(t, c.Name, a, w.env))
			}
			out[img] = w
		}
	}
	return out
}

// resolveEnv gives each variable its value, or for the downward API a
// plausible dummy of the right shape.
func resolveEnv(t *testing.T, w *workload) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range w.c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expand(t, w.c.Name, e.Value, env)
		case e.ValueFrom.FieldRef != nil:
			v, ok := map[string]string{
				"metadata.name":           w.name + "-x1y2z",
				"metadata.namespace":      w.namespace,
				"spec.nodeName":           "node-1",
				"spec.serviceAccountName": w.pod.ServiceAccountName,
				"status.hostIP":           "10.0.0.1",
				"status.podIP":            "10.244.0.7",
			}[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Errorf("%s: env %s: fieldPath %s has no dummy in this test", w.c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = v
		default:
			t.Errorf("%s: env %s: only value and fieldRef are understood by this test", w.c.Name, e.Name)
		}
	}
	return env
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand replaces $(VAR) as the kubelet does; an undefined VAR (which the
// kubelet would leave as is) is an error.
func expand(t *testing.T, container, s string, env map[string]string) string {
	t.Helper()
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		name := varRef.FindStringSubmatch(m)[1]
		v, ok := env[name]
		if !ok {
			t.Errorf("%s: %q refers to $(%s), which the container does not define (before it)", container, s, name)
		}
		return v
	})
}

// checkFlags runs bin --check-flags with w's arguments and environment
// only, and decodes what it prints into summary. These binaries read no
// environment, so every variable must be there for a $(VAR) argument.
func checkFlags(t *testing.T, bin string, w *workload, summary any) {
	t.Helper()
	for name := range w.env {
		if !slices.ContainsFunc(w.c.Args, func(a string) bool { return strings.Contains(a, "$("+name+")") }) {
			t.Errorf("%s sets %s, which no argument uses and the binary does not read", w.c.Name, name)
		}
	}
	cmd := exec.Command(bin, append(slices.Clone(w.args), "--check-flags")...)
	cmd.Env = []string{}
	for k, v := range w.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		// The first lines name the problem; the usage that follows does not.
		lines := strings.SplitN(stderr.String(), "\n", 3)
		t.Errorf("%s with the manifest's arguments %q: %v: %s", w.c.Name, w.args, err, strings.Join(lines[:min(2, len(lines))], " / "))
		return
	}
	if err := json.Unmarshal(stdout.Bytes(), summary); err != nil {
		t.Errorf("%s --check-flags printed %q: %v", w.c.Name, stdout.String(), err)
	}
}

// ztunnelConfig checks the node proxy's environment: every name is one
// internal/node/config defines, and config.Parse accepts the values.
func ztunnelConfig(t *testing.T, w *workload) *config.Config {
	t.Helper()
	if len(w.args) > 0 {
		t.Errorf("%s: arguments %q: the node proxy takes its configuration from the environment", w.c.Name, w.args)
	}
	names, prefixes := configEnvNames(t)
	var environ []string
	for name, v := range w.env {
		if !names[name] && !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			t.Errorf("%s sets %s, which internal/node/config does not read", w.c.Name, name)
		}
		environ = append(environ, name+"="+v)
	}
	cfg, err := config.Parse(func(k string) (string, bool) { v, ok := w.env[k]; return v, ok }, environ)
	if err != nil {
		t.Errorf("%s: the manifest's environment: %v", w.c.Name, err)
		return &config.Config{}
	}
	return cfg
}

// configEnvNames reads internal/node/config's Env* string constants from its
// source: names, and prefixes (constants named *Prefix).
func configEnvNames(t *testing.T) (map[string]bool, []string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "internal", "node", "config", "config.go"), nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	var prefixes []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, id := range vs.Names {
				if !strings.HasPrefix(id.Name, "Env") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasSuffix(id.Name, "Prefix") {
					prefixes = append(prefixes, v)
				} else {
					names[v] = true
				}
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("found only %d Env constants in internal/node/config; has the file moved?", len(names))
	}
	return names, prefixes
}

func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("address %q: %v", addr, err)
		return -1
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Errorf("address %q: %v", addr, err)
	}
	return n
}

func hasContainerPort(c corev1.Container, p int) bool {
	return slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return int(cp.ContainerPort) == p })
}

// checkProbes: every HTTP probe of w hits addr's port and path; a
// readiness and a startup probe exist.
func checkProbes(t *testing.T, w *workload, addr, wantPath string) {
	t.Helper()
	if addr == "" || wantPath == "" {
		t.Errorf("%s serves no readiness endpoint (address %q, path %q)", w.c.Name, addr, wantPath)
		return
	}
	want := port(t, addr)
	probes := map[string]*corev1.Probe{"readiness": w.c.ReadinessProbe, "startup": w.c.StartupProbe, "liveness": w.c.LivenessProbe}
	for kind, p := range probes {
		if p == nil {
			if kind != "liveness" {
				t.Errorf("%s has no %s probe", w.c.Name, kind)
			}
			continue
		}
		if p.HTTPGet == nil {
			t.Errorf("%s %s probe is not an HTTP GET", w.c.Name, kind)
			continue
		}
		got := p.HTTPGet.Port.IntValue()
		if p.HTTPGet.Port.IntValue() == 0 { // a named port
			for _, cp := range w.c.Ports {
				if cp.Name == p.HTTPGet.Port.String() {
					got = int(cp.ContainerPort)
				}
			}
		}
		if got != want || p.HTTPGet.Path != wantPath {
			t.Errorf("%s %s probe GETs port %d %s; the binary serves %s on %s", w.c.Name, kind, got, p.HTTPGet.Path, wantPath, addr)
		}
	}
}

// checkDebugPrivate: w's debug server (admin, "" when disabled) binds
// loopback only, so it is no declared container port, and no Service that
// selects w's pods forwards to a port other than public's (the ports that
// serve gRPC, metrics or readiness).
func checkDebugPrivate(t *testing.T, objs []*unstructured.Unstructured, w *workload, admin string, public ...string) {
	t.Helper()
	if admin != "" {
		if err := daemon.ValidateAddr(admin, true); err != nil {
			t.Errorf("%s debug server: %v", w.c.Name, err)
		}
		if hasContainerPort(w.c, port(t, admin)) {
			t.Errorf("%s declares its loopback-only debug port %s", w.c.Name, admin)
		}
	}
	allowed := map[int]bool{}
	for _, a := range public {
		if a != "" {
			allowed[port(t, a)] = true
		}
	}
	for _, o := range objs {
		if o.GetKind() != "Service" || o.GetNamespace() != w.namespace {
			continue
		}
		var svc corev1.Service
		if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &svc); err != nil {
			t.Fatal(err)
		}
		if len(svc.Spec.Selector) == 0 || !selects(svc.Spec.Selector, w.labels) {
			continue
		}
		for _, sp := range svc.Spec.Ports {
			tp := sp.TargetPort.IntValue()
			if tp == 0 {
				tp = int(sp.Port)
			}
			if !allowed[tp] {
				t.Errorf("Service %s exposes %s port %d, which serves none of %v", svc.Name, w.c.Name, tp, public)
			}
		}
	}
}

func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// mountOf finds the volume mounted at the longest prefix of p and the rest
// of p below it.
func mountOf(w *workload, p string) (*corev1.Volume, string, bool) {
	var best *corev1.VolumeMount
	for i := range w.c.VolumeMounts {
		m := &w.c.VolumeMounts[i]
		if (p == m.MountPath || strings.HasPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/")) && (best == nil || len(m.MountPath) > len(best.MountPath)) {
			best = m
		}
	}
	if best == nil {
		return nil, "", false
	}
	rest := strings.TrimPrefix(strings.TrimPrefix(p, best.MountPath), "/")
	for i := range w.pod.Volumes {
		if w.pod.Volumes[i].Name == best.Name {
			return &w.pod.Volumes[i], rest, true
		}
	}
	return nil, "", false
}

// hostPath is where p in w's container is on the host, if on a hostPath volume.
func hostPath(w *workload, p string) (string, bool) {
	v, rest, ok := mountOf(w, p)
	if !ok || v.HostPath == nil {
		return "", false
	}
	return path.Join(v.HostPath.Path, rest), true
}

// configMapFile is "<configmap>:<key>" for a file of a ConfigMap volume.
func configMapFile(w *workload, p string) (string, bool) {
	v, rest, ok := mountOf(w, p)
	if !ok || v.ConfigMap == nil {
		return "", false
	}
	key := rest
	for _, it := range v.ConfigMap.Items {
		if it.Path == rest {
			key = it.Key
		}
	}
	return v.ConfigMap.Name + ":" + key, true
}

// projectedToken: p is a projected ServiceAccount token with audience aud.
func projectedToken(w *workload, p, aud string) bool {
	v, rest, ok := mountOf(w, p)
	if !ok || v.Projected == nil {
		return false
	}
	for _, s := range v.Projected.Sources {
		if s.ServiceAccountToken != nil && s.ServiceAccountToken.Path == rest && s.ServiceAccountToken.Audience == aud {
			return true
		}
	}
	return false
}

// serviceReaches: host is <service>.<namespace>.svc of a Service whose
// selector picks w's pods and whose port p targets targetPort.
func serviceReaches(t *testing.T, objs []*unstructured.Unstructured, host, p string, w *workload, targetPort int) bool {
	t.Helper()
	name, rest, _ := strings.Cut(host, ".")
	ns, suffix, _ := strings.Cut(rest, ".")
	if suffix != "svc" && suffix != "svc.cluster.local" {
		return false
	}
	for _, o := range objs {
		if o.GetKind() != "Service" || o.GetName() != name || o.GetNamespace() != ns {
			continue
		}
		var svc corev1.Service
		if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &svc); err != nil {
			t.Fatal(err)
		}
		if ns != w.namespace || len(svc.Spec.Selector) == 0 {
			return false
		}
		for k, v := range svc.Spec.Selector {
			if w.labels[k] != v {
				return false
			}
		}
		for _, sp := range svc.Spec.Ports {
			tp := sp.TargetPort.IntValue()
			if tp == 0 {
				tp = int(sp.Port)
			}
			if strconv.Itoa(int(sp.Port)) == p && tp == targetPort {
				return true
			}
		}
	}
	return false
}

// grants evaluates the manifests' RBAC: does ServiceAccount sa ("ns/name")
// get verb on group/resource (named name; "" for any) in namespace ns ("" for
// cluster-scoped)? Only rules bound by the manifests count.
func grants(t *testing.T, objs []*unstructured.Unstructured, sa, ns, group, resource, name, verb string) bool {
	t.Helper()
	saNs, saName, _ := strings.Cut(sa, "/")
	roles := map[string][]rbacv1.PolicyRule{} // "Kind/ns/name"
	var bindings []struct {
		ns      string
		binding rbacv1.RoleBinding
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "Role", "ClusterRole":
			var r rbacv1.ClusterRole // same rules shape
			if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
				t.Fatal(err)
			}
			roles[fmt.Sprintf("%s/%s/%s", o.GetKind(), o.GetNamespace(), o.GetName())] = r.Rules
		case "RoleBinding", "ClusterRoleBinding":
			var b rbacv1.RoleBinding
			if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
				t.Fatal(err)
			}
			bindings = append(bindings, struct {
				ns      string
				binding rbacv1.RoleBinding
			}{o.GetNamespace(), b})
		}
	}
	match := func(list []string, v string) bool { return slices.Contains(list, v) || slices.Contains(list, "*") }
	for _, b := range bindings {
		if b.ns != "" && b.ns != ns { // a RoleBinding grants only in its namespace
			continue
		}
		if !slices.ContainsFunc(b.binding.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == saName && s.Namespace == saNs
		}) {
			continue
		}
		roleNs := ""
		if b.binding.RoleRef.Kind == "Role" {
			roleNs = b.ns
		}
		for _, r := range roles[fmt.Sprintf("%s/%s/%s", b.binding.RoleRef.Kind, roleNs, b.binding.RoleRef.Name)] {
			if match(r.APIGroups, group) && match(r.Resources, resource) && match(r.Verbs, verb) &&
				(len(r.ResourceNames) == 0 || (name != "" && slices.Contains(r.ResourceNames, name))) {
				return true
			}
		}
	}
	return false
}

// checkWebhook: the chart's ValidatingWebhookConfiguration is the one
// ztunnel-cp keeps the caBundle of, fails closed, and calls a Service name
// the serving certificate covers, on a port that forwards to
// --webhook-addr.
func checkWebhook(t *testing.T, objs []*unstructured.Unstructured, cpw *workload, cp cpSummary) {
	t.Helper()
	if cp.WebhookAddr == "" {
		t.Error("ztunnel-cp serves no admission webhook (--webhook-addr)")
		return
	}
	found := false
	for _, o := range objs {
		if o.GetKind() != "ValidatingWebhookConfiguration" {
			continue
		}
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &vwc); err != nil {
			t.Fatal(err)
		}
		if vwc.Name != webhook.ConfigurationName {
			t.Errorf("ValidatingWebhookConfiguration %s: ztunnel-cp sets the caBundle of %s only", vwc.Name, webhook.ConfigurationName)
			continue
		}
		found = true
		for _, wh := range vwc.Webhooks {
			svc := wh.ClientConfig.Service
			if svc == nil || svc.Path == nil || *svc.Path != webhook.Path {
				t.Errorf("webhook %s: want a Service reference with path %s, got %+v", wh.Name, webhook.Path, wh.ClientConfig)
				continue
			}
			if wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Fail {
				t.Errorf("webhook %s: failurePolicy %v, want Fail", wh.Name, wh.FailurePolicy)
			}
			p := int32(443)
			if svc.Port != nil {
				p = *svc.Port
			}
			host := svc.Name + "." + svc.Namespace + ".svc"
			if !slices.Contains(cp.ServingNames, host) {
				t.Errorf("webhook %s calls %s, not in the serving certificate %v", wh.Name, host, cp.ServingNames)
			}
			if !serviceReaches(t, objs, host, strconv.Itoa(int(p)), cpw, port(t, cp.WebhookAddr)) {
				t.Errorf("webhook %s: Service %s port %d does not forward to --webhook-addr %s", wh.Name, host, p, cp.WebhookAddr)
			}
		}
	}
	if !found {
		t.Errorf("no ValidatingWebhookConfiguration %s in the manifests", webhook.ConfigurationName)
	}
}
