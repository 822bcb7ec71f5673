package kube

import (
	"bytes"
	"encoding/json"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func sampleObjects() []Object {
	return []Object{
		&Namespace{Meta{Name: "demo", Labels: map[string]string{"istio.io/dataplane-mode": "ambient"}}},
		&Pod{
			Meta: Meta{
				Name: "client", Namespace: "demo", UID: "6f1c2b0e-0000-4000-8000-000000000001",
				Labels:      map[string]string{"app": "client", "version": "1"},
				Annotations: map[string]string{"ambient.istio.io/redirection": "enabled", "odd": "true: [x]"},
			},
			NodeName: "node0", ServiceAccount: "client",
			Containers: []Container{{Name: "app", Ports: []ContainerPort{{Name: "http", Port: 8080}}}},
			Phase:      PodRunning, Ready: true,
			HostIP: netip.MustParseAddr("10.30.0.10"),
			IPs:    []netip.Addr{netip.MustParseAddr("10.31.0.10")},
		},
		&Pod{Meta: Meta{Name: "pending", Namespace: "demo", UID: "u2"}, NodeName: "node1"},
		&Pod{Meta: Meta{Name: "hostnet", Namespace: "kube-system", UID: "u3"}, NodeName: "node1", HostNetwork: true,
			Phase: PodRunning, Ready: true, HostIP: netip.MustParseAddr("10.30.0.11"), IPs: []netip.Addr{netip.MustParseAddr("10.30.0.11")}},
		&Service{
			Meta:      Meta{Name: "server", Namespace: "demo", UID: "u4"},
			ClusterIP: netip.MustParseAddr("10.32.0.10"),
			Selector:  map[string]string{"app": "server"},
			Ports: []ServicePort{
				{Name: "http", Port: 80, TargetPortName: "http", AppProtocol: "http"},
				{Name: "tcp", Port: 9000, TargetPort: 9090},
				{Name: "dns", Port: 53, Protocol: "UDP"},
			},
		},
		&EndpointSlice{
			Meta:        Meta{Name: "server-abc", Namespace: "demo", UID: "u5"},
			ServiceName: "server",
			Ports:       []EndpointPort{{Name: "tcp", Port: 9090}},
			Endpoints: []Endpoint{{Address: netip.MustParseAddr("10.31.1.10"), NodeName: "node1", Ready: true,
				TargetRef: Ref{Kind: "Pod", Namespace: "demo", Name: "server", UID: "u6"}}},
		},
		&Raw{
			APIVersion: "security.istio.io/v1", Kind: "AuthorizationPolicy",
			Meta: Meta{Name: "allow-client", Namespace: "demo"},
			Fields: Map{{"spec", map[string]any{
				"action": "ALLOW",
				"rules": []any{map[string]any{
					"from": []any{map[string]any{"source": map[string]any{"principals": []string{"cluster.local/ns/demo/sa/client"}}}},
					"to":   []any{map[string]any{}},
				}},
			}}},
		},
	}
}

// TestGolden pins the exact text: it is what people read when a test fails.
func TestGolden(t *testing.T) {
	files, err := Render(sampleObjects())
	if err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	for _, f := range []string{"authorizationpolicy.yaml", "endpointslice.yaml", "namespace.yaml", "pod.yaml", "service.yaml"} {
		data, ok := files[f]
		if !ok {
			t.Fatalf("Render produced no %s; got %v", f, keys(files))
		}
		all.WriteString("# " + f + "\n")
		all.Write(data)
	}
	if len(files) != 5 {
		t.Errorf("Render produced %d files, want 5: %v", len(files), keys(files))
	}
	golden := filepath.Join("testdata", "objects.golden.yaml")
	if *update {
		if err := os.WriteFile(golden, all.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(all.Bytes(), want) {
		t.Errorf("rendered YAML differs from %s (rerun with -update if intended):\n%s", golden, all.String())
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func splitDocs(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(data, []byte("---\n")) {
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

// TestDecodesStrictly proves the YAML is the Kubernetes API: every document
// decodes into the real k8s.io/api type with unknown fields rejected, and the
// fields the mesh reads come back with the values we put in.
func TestDecodesStrictly(t *testing.T) {
	files, err := Render(sampleObjects())
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	for _, doc := range splitDocs(files["pod.yaml"]) {
		var p corev1.Pod
		if err := yaml.UnmarshalStrict(doc, &p); err != nil {
			t.Fatalf("pod: %v\n%s", err, doc)
		}
		pods = append(pods, p)
	}
	if len(pods) != 3 {
		t.Fatalf("got %d pods, want 3", len(pods))
	}
	// Sorted by namespace/name: demo/client, demo/pending, kube-system/hostnet.
	c := pods[0]
	if c.Name != "client" || string(c.UID) != "6f1c2b0e-0000-4000-8000-000000000001" || c.Spec.NodeName != "node0" ||
		c.Spec.ServiceAccountName != "client" || c.Status.PodIP != "10.31.0.10" || c.Status.HostIP != "10.30.0.10" ||
		c.Status.Phase != corev1.PodRunning || len(c.Status.PodIPs) != 1 || c.Labels["version"] != "1" ||
		c.Annotations["odd"] != "true: [x]" || c.Spec.Containers[0].Ports[0].ContainerPort != 8080 {
		t.Errorf("client pod decoded wrong: %+v", c)
	}
	if len(c.Status.Conditions) != 1 || c.Status.Conditions[0].Type != corev1.PodReady || c.Status.Conditions[0].Status != corev1.ConditionTrue {
		t.Errorf("client conditions = %+v, want Ready=True", c.Status.Conditions)
	}
	if p := pods[1]; p.Status.Phase != corev1.PodPending || p.Status.PodIP != "" || p.Spec.ServiceAccountName != "default" {
		t.Errorf("pending pod decoded wrong: %+v", p.Status)
	}
	if p := pods[2]; !p.Spec.HostNetwork || p.Namespace != "kube-system" || p.Status.PodIP != "10.30.0.11" {
		t.Errorf("hostnet pod decoded wrong: %+v", p)
	}

	var svc corev1.Service
	if err := yaml.UnmarshalStrict(files["service.yaml"], &svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != "10.32.0.10" || svc.Spec.Selector["app"] != "server" || len(svc.Spec.Ports) != 3 ||
		svc.Spec.Ports[0].TargetPort.StrVal != "http" || svc.Spec.Ports[1].TargetPort.IntVal != 9090 ||
		svc.Spec.Ports[2].TargetPort.IntVal != 53 || svc.Spec.Ports[2].Protocol != corev1.ProtocolUDP ||
		*svc.Spec.Ports[0].AppProtocol != "http" {
		t.Errorf("service decoded wrong: %+v", svc.Spec)
	}

	var es discoveryv1.EndpointSlice
	if err := yaml.UnmarshalStrict(files["endpointslice.yaml"], &es); err != nil {
		t.Fatal(err)
	}
	if es.Labels[discoveryv1.LabelServiceName] != "server" || es.AddressType != discoveryv1.AddressTypeIPv4 ||
		len(es.Endpoints) != 1 || es.Endpoints[0].Addresses[0] != "10.31.1.10" || !*es.Endpoints[0].Conditions.Ready ||
		es.Endpoints[0].TargetRef.Name != "server" || *es.Ports[0].Port != 9090 {
		t.Errorf("endpointslice decoded wrong: %+v", es)
	}

	var ns corev1.Namespace
	if err := yaml.UnmarshalStrict(files["namespace.yaml"], &ns); err != nil {
		t.Fatal(err)
	}
	if ns.Labels["istio.io/dataplane-mode"] != "ambient" {
		t.Errorf("namespace labels = %v", ns.Labels)
	}

	// Raw objects round-trip exactly, empty mappings included.
	var got map[string]any
	if err := yaml.Unmarshal(files["authorizationpolicy.yaml"], &got); err != nil {
		t.Fatal(err)
	}
	wantJSON := `{"apiVersion":"security.istio.io/v1","kind":"AuthorizationPolicy",
		"metadata":{"name":"allow-client","namespace":"demo"},
		"spec":{"action":"ALLOW","rules":[{"from":[{"source":{"principals":["cluster.local/ns/demo/sa/client"]}}],"to":[{}]}]}}`
	var want map[string]any
	if err := json.Unmarshal([]byte(wantJSON), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("raw object = %v, want %v", got, want)
	}
}

// TestScalars checks that strings YAML would read as something else stay
// strings, and that the rest is written plain for readability.
func TestScalars(t *testing.T) {
	for _, tc := range []struct {
		in    string
		plain bool
	}{
		{"ambient", true},
		{"istio.io/dataplane-mode", true},
		{"10.31.0.10", true},
		{"10.31.0.0/24", true},
		{"true", false}, {"False", false}, {"yes", false}, {"on", false}, {"null", false}, {"~", false},
		{"8080", false}, {"0x1F", false}, {"1e3", false}, {".inf", false}, {"1_000", false},
		{"2026-01-02", false}, {"", false}, {"-x", false}, {"a: b", false}, {"a #b", false},
		{"*alias", false}, {"line\nbreak", false}, {"é", false},
	} {
		got := scalarString(tc.in)
		if (got == tc.in) != tc.plain {
			t.Errorf("scalarString(%q) = %s, want plain=%v", tc.in, got, tc.plain)
		}
		var back map[string]string
		if err := yaml.Unmarshal([]byte("k: "+got+"\n"), &back); err != nil || back["k"] != tc.in {
			t.Errorf("%q written as %s reads back as %q (%v)", tc.in, got, back["k"], err)
		}
	}
}

func TestWriteDirReplacesAndRemoves(t *testing.T) {
	dir := t.TempDir()
	objs := sampleObjects()
	if err := WriteDir(dir, objs); err != nil {
		t.Fatal(err)
	}
	if err := WriteDir(dir, objs[:2]); err != nil { // namespace and one pod
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "namespace.yaml,pod.yaml" {
		t.Errorf("dir holds %v, want namespace.yaml,pod.yaml (no temp files, stale kinds removed)", names)
	}
	data, err := os.ReadFile(filepath.Join(dir, "pod.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(splitDocs(data)); n != 1 {
		t.Errorf("pod.yaml has %d documents, want 1", n)
	}
}
