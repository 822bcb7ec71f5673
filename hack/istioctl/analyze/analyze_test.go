// Package analyze runs istioctl analyze's analyzers over the objects we
// create. It is a package of its own: it links istio's workload protos,
// which cannot share a binary with ours (the ztunnel-config test's).
package analyze

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"istio.io/istio/pkg/config/analysis/analyzers"
	"istio.io/istio/pkg/config/analysis/diag"
	"istio.io/istio/pkg/config/analysis/local"
	"istio.io/istio/pkg/config/resource"
	"sigs.k8s.io/yaml"
)

// proxyContainer is the waypoint container's name Istio's tools know
// (waypointctl.ProxyContainer; not imported here, see waypointobjects).
const proxyContainer = "istio-proxy"

// manifests is the chart rendered with its default values (deploy/check.sh
// keeps it equal to `helm template`).
const manifests = "../../../deploy/manifests/ztunnel-go.yaml"

// TestIstioctlAnalyzeOurObjects runs istioctl analyze's analyzers, as
// `istioctl analyze --use-kube=false -A <files>` runs them, over every
// object we create: the chart's rendered manifests (control plane, node
// proxy, agent, their Services, accounts and ConfigMaps) and a waypoint's
// ServiceAccount, Service and Deployment as our waypoint controller
// applies them, both built in and from the chart's template. None of them
// may get a finding (IST0144 for UID 1337, IST0118 for port names, ...).
// A control: the waypoint Deployment with its proxy container renamed is
// reported, so the analyzers did run on it.
func TestIstioctlAnalyzeOurObjects(t *testing.T) {
	raw, err := os.ReadFile(manifests)
	if err != nil {
		t.Fatal(err)
	}
	var chartDocs []string
	var tmplData map[string]string
	for doc := range strings.SplitSeq(string(raw), "\n---") {
		var m struct {
			Kind     string
			Metadata struct{ Name string }
			Data     map[string]string
		}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("%s: %v", manifests, err)
		}
		if m.Kind == "" || m.Kind == "CustomResourceDefinition" {
			continue
		}
		if m.Kind == "ConfigMap" && m.Metadata.Name == "ztunnel-go-waypoint-template" {
			tmplData = m.Data
		}
		chartDocs = append(chartDocs, doc)
	}
	if len(chartDocs) < 10 || tmplData["deployment.yaml"] == "" {
		t.Fatalf("%s: %d objects, waypoint template %v", manifests, len(chartDocs), tmplData != nil)
	}
	dir := t.TempDir()
	tmplFile, valuesFile := filepath.Join(dir, "deployment.yaml"), filepath.Join(dir, "values.yaml")
	for f, data := range map[string]string{tmplFile: tmplData["deployment.yaml"], valuesFile: tmplData["values.yaml"]} {
		if err := os.WriteFile(f, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The waypoint objects, as the controller applies them: built in (in
	// namespace shop) and from the chart's template (in namespace books).
	var ours []string
	wpDocs := waypointObjects(t, "shop", "", "")
	wpDocs = append(wpDocs, waypointObjects(t, "books", tmplFile, valuesFile)...)
	user := `apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient, istio.io/use-waypoint: waypoint}}
---
apiVersion: v1
kind: Namespace
metadata: {name: books, labels: {istio.io/dataplane-mode: ambient, istio.io/use-waypoint: waypoint}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: books}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}
`
	// Each Deployment's and DaemonSet's pod, as the cluster would run it.
	chartDocs = append(chartDocs, podsOf(t, chartDocs)...)
	wpDocs = append(wpDocs, podsOf(t, wpDocs)...)
	for _, d := range append(slices.Clone(chartDocs), wpDocs...) {
		ours = append(ours, friendlyName(t, d))
	}
	if !slices.Contains(ours, "Deployment books/waypoint") || !slices.Contains(ours, "Service shop/waypoint") ||
		!slices.Contains(ours, "Pod istio-system/ztunnel-cp-0") || !slices.Contains(ours, "Pod shop/waypoint-0") {
		t.Fatalf("waypoint objects missing: %v", ours)
	}

	msgs := analyze(t, append(append(slices.Clone(chartDocs), wpDocs...), user))
	for _, m := range msgs {
		t.Logf("istioctl analyze: %s", m.String())
		if m.Resource != nil && slices.Contains(ours, m.Resource.Origin.FriendlyName()) {
			t.Errorf("finding about our %s: %s", m.Resource.Origin.FriendlyName(), m.String())
		}
	}

	// Control: with its container not named istio-proxy, the waypoint's
	// UID 1337 is reported (IST0144) by the same analysis.
	var renamed []string
	for _, d := range wpDocs {
		if n := friendlyName(t, d); strings.HasPrefix(n, "Deployment ") || strings.HasPrefix(n, "Pod ") {
			d = strings.ReplaceAll(d, "name: "+proxyContainer, "name: waypoint")
		}
		renamed = append(renamed, d)
	}
	found := map[string]bool{}
	for _, m := range analyze(t, append(renamed, user)) {
		if m.Type.Code() == "IST0144" && m.Resource != nil {
			found[m.Resource.Origin.FriendlyName()] = true
		}
	}
	if !found["Deployment shop/waypoint"] || !found["Pod shop/waypoint-0"] {
		t.Logf("IST0144 on %v", found)
		t.Error("the control (waypoint container not named istio-proxy) is not reported as IST0144: did the analyzers run?")
	}
}

// analyze runs istioctl analyze's analyzers on the documents as local
// files (no cluster), all namespaces, istio-system as Istio's namespace.
func analyze(t *testing.T, docs []string) diag.Messages {
	t.Helper()
	sa := local.NewIstiodAnalyzer(analyzers.AllCombined(), "", resource.Namespace("istio-system"), nil)
	// The runtime kinds (Pods, Deployments, Services, Namespaces) are what a
	// live cluster's `istioctl analyze -A` reads and what the findings were
	// about; istioctl's file mode leaves them out, so they are added the
	// way Istio's own analyzer tests add them.
	if err := sa.AddTestReaderKubeSource([]local.ReaderSource{{Name: "objects.yaml", Reader: strings.NewReader(strings.Join(docs, "\n---\n"))}}); err != nil {
		t.Fatalf("istioctl analyze cannot read the objects: %v", err)
	}
	// After the objects: the first source added decides which kinds are
	// read. The defaults are what istioctl adds without a cluster.
	if err := sa.AddDefaultResources(); err != nil {
		t.Fatal(err)
	}
	res, err := sa.Analyze(make(chan struct{}))
	if err != nil {
		t.Fatal(err)
	}
	return res.Messages
}

// friendlyName is how istioctl analyze names an object: "Kind ns/name".
func friendlyName(t *testing.T, doc string) string {
	t.Helper()
	var m struct {
		Kind     string
		Metadata struct{ Name, Namespace string }
	}
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatal(err)
	}
	ns := m.Metadata.Namespace
	if ns == "" {
		return m.Kind + " " + m.Metadata.Name
	}
	return m.Kind + " " + ns + "/" + m.Metadata.Name
}

// waypointObjects runs waypointobjects: the objects our waypoint
// controller applies for Gateway ns/waypoint, as YAML documents.
func waypointObjects(t *testing.T, ns, tmplFile, valuesFile string) []string {
	t.Helper()
	args := []string{"run", "../waypointobjects", "-namespace", ns}
	if tmplFile != "" {
		args = append(args, "-template", tmplFile, "-values", valuesFile)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("go", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var docs []string
	for d := range strings.SplitSeq(string(out), "---\n") {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, d)
		}
	}
	if len(docs) != 3 {
		t.Fatalf("waypointobjects in %s: %d objects\n%s", ns, len(docs), out)
	}
	if !strings.Contains(docs[2], "name: "+proxyContainer) {
		t.Fatalf("the waypoint Deployment's container is not %s:\n%s", proxyContainer, docs[2])
	}
	return docs
}

// podsOf makes, for each Deployment and DaemonSet among docs, the pod the
// cluster runs from its template: "<name>-0" in its namespace, with the
// template's labels and spec.
func podsOf(t *testing.T, docs []string) []string {
	t.Helper()
	var pods []string
	for _, d := range docs {
		var w struct {
			Kind     string
			Metadata struct{ Name, Namespace string }
			Spec     struct {
				Template struct {
					Metadata map[string]any
					Spec     map[string]any
				}
			}
		}
		if err := yaml.Unmarshal([]byte(d), &w); err != nil {
			t.Fatal(err)
		}
		if w.Kind != "Deployment" && w.Kind != "DaemonSet" {
			continue
		}
		meta := w.Spec.Template.Metadata
		if meta == nil {
			meta = map[string]any{}
		}
		meta["name"], meta["namespace"] = w.Metadata.Name+"-0", w.Metadata.Namespace
		b, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": w.Spec.Template.Spec})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, string(b))
	}
	if len(pods) == 0 {
		t.Fatal("no Deployment or DaemonSet among the objects")
	}
	return pods
}
