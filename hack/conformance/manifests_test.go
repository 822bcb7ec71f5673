package conformance

import (
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/gateway-api/conformance"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/yaml"
)

const (
	// meshManifestsPath is where the suite finds its mesh manifests with
	// our labels and waypoint (in the first of its ManifestFS).
	meshManifestsPath = "ztunnel-go/mesh-manifests.yaml"
	waypointName      = "waypoint"
	waypointClass     = "istio-waypoint"
	// echoImage is the reference of the suite's echo containers, which
	// hack/images/testimage (EchoRef) gives Istio's echo app.
	echoImage = "registry.k8s.io/gateway-api/echo-advanced:v1.5.1"
)

// namespaceLabels are the labels the mesh manifests' namespaces get: both
// are enrolled in ambient (the suite sends requests from pods of both), and
// the Services of gateway-conformance-mesh, which every test routes to, are
// bound to its waypoint. The consumer namespace has no Service, only
// clients: its consumer routes apply at the producer's waypoint.
//
// Why the manifests and not the suite's NamespaceLabels option or
// namespaces made beforehand: NamespaceLabels puts the same labels on every
// namespace, so the consumer namespace would name a waypoint it does not
// have; and the suite applies its manifest's Namespace with Update, which
// replaces the labels of a namespace made beforehand. Changing the manifest
// the suite reads keeps both namespaces exactly as the suite defines them
// plus the labels, and the labels are there when the echo pods start (the
// node agent captures a pod when it is created).
var namespaceLabels = map[string]map[string]string{
	suite.MeshNamespace: {
		"istio.io/dataplane-mode": "ambient",
		"istio.io/use-waypoint":   waypointName,
	},
	suite.MeshConsumerNamespace: {
		"istio.io/dataplane-mode": "ambient",
	},
}

// waypointGateway is the waypoint of gateway-conformance-mesh, as `zctl
// waypoint apply` writes it; ztunnel-cp deploys it. It follows its
// namespace in the manifest, so the suite waits for its pod with the echo
// pods (MeshNamespacesMustBeReady) and the waypoint starts alongside them.
var waypointGateway = fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: %s
  namespace: %s
  labels:
    istio.io/waypoint-for: service
spec:
  gatewayClassName: %s
  listeners:
  - name: mesh
    port: 15008
    protocol: HBONE
`, waypointName, suite.MeshNamespace, waypointClass)

// meshManifests is the suite's mesh/manifests.yaml with namespaceLabels on
// its namespaces and waypointGateway after the mesh namespace, as a file
// system for the suite's ManifestFS. The echo image keeps the suite's name:
// hack/images/testimage writes Istio's echo app under it.
func meshManifests() (fs.FS, error) {
	raw, err := fs.ReadFile(conformance.Manifests, "mesh/manifests.yaml")
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(doc), "---")) == "" {
			continue
		}
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			return nil, fmt.Errorf("mesh manifests: %w", err)
		}
		if u.GetKind() != "Namespace" {
			out = append(out, doc)
			continue
		}
		want, ok := namespaceLabels[u.GetName()]
		if !ok {
			return nil, fmt.Errorf("mesh manifests: namespace %s has no labels here; a new suite version?", u.GetName())
		}
		seen[u.GetName()] = true
		labels := u.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		for k, v := range want {
			labels[k] = v
		}
		u.SetLabels(labels)
		b, err := yaml.Marshal(u.Object)
		if err != nil {
			return nil, err
		}
		out = append(out, string(b))
		if u.GetName() == suite.MeshNamespace {
			out = append(out, waypointGateway)
		}
	}
	for ns := range namespaceLabels {
		if !seen[ns] {
			return nil, fmt.Errorf("mesh manifests: no namespace %s; a new suite version?", ns)
		}
	}
	return fstest.MapFS{meshManifestsPath: {Data: []byte(strings.Join(out, "\n---\n"))}}, nil
}

// TestMeshManifests: the manifests the suite reads are its own plus the
// labels on both namespaces and the waypoint right after the mesh
// namespace, and the echo image keeps the name testimage writes.
func TestMeshManifests(t *testing.T) {
	fsys, err := meshManifests()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := fs.ReadFile(fsys, meshManifestsPath)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	labels := map[string]map[string]string{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		kinds = append(kinds, u.GetKind()+"/"+u.GetName())
		if u.GetKind() == "Namespace" {
			labels[u.GetName()] = u.GetLabels()
		}
	}
	if kinds[0] != "Namespace/"+suite.MeshNamespace || kinds[1] != "Gateway/"+waypointName {
		t.Errorf("manifests start %v, want the mesh namespace, then the waypoint", kinds[:2])
	}
	for ns, want := range namespaceLabels {
		for k, v := range want {
			if labels[ns][k] != v {
				t.Errorf("namespace %s labels %v, want %s=%s", ns, labels[ns], k, v)
			}
		}
	}
	if labels[suite.MeshConsumerNamespace]["istio.io/use-waypoint"] != "" {
		t.Errorf("consumer namespace bound to a waypoint: %v", labels[suite.MeshConsumerNamespace])
	}
	if labels[suite.MeshNamespace]["gateway-conformance"] != "mesh" {
		t.Errorf("the suite's own label is gone: %v", labels[suite.MeshNamespace])
	}
	if n := strings.Count(string(raw), "image: "+echoImage); n != 3 {
		t.Errorf("%d echo containers name %s, want 3 (hack/images/testimage writes that reference)", n, echoImage)
	}
}
