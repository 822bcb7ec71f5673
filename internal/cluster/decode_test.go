package cluster_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

const good = `
# a comment-only document is skipped
---
apiVersion: v1
kind: Namespace
metadata:
  name: apps
  labels: {istio.io/dataplane-mode: ambient}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: apps, uid: u-1}
spec:
  nodeName: node-0
  serviceAccountName: client
  containers: [{name: app, image: x}]
status: {podIP: 10.1.0.2, phase: Running}
---
apiVersion: v1
kind: Service
metadata: {name: server}
spec:
  clusterIP: 10.96.0.10
  selector: {app: server}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external, namespace: apps}
spec:
  hosts: [api.example.com]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: DNS
status:
  addresses: [{value: 240.240.0.1, host: api.example.com}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow, namespace: apps}
spec:
  action: ALLOW
  rules: [{from: [{source: {principals: ["cluster.local/ns/apps/sa/client"]}}]}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: apps}
spec: {mtls: {mode: STRICT}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: apps}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: plain}
`

func TestDecodeAllKinds(t *testing.T) {
	var o cluster.Objects
	if errs := cluster.Decode("good.yaml", []byte(good), &o); len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	o.Sort()
	if len(o.Namespaces) != 2 || o.Namespaces[0].Name != "apps" || o.Namespaces[0].Labels["istio.io/dataplane-mode"] != "ambient" {
		t.Fatalf("namespaces: %+v", o.Namespaces)
	}
	if len(o.Pods) != 1 || o.Pods[0].Spec.NodeName != "node-0" || o.Pods[0].Status.PodIP != "10.1.0.2" || string(o.Pods[0].UID) != "u-1" {
		t.Fatalf("pods: %+v", o.Pods)
	}
	if len(o.Services) != 1 || o.Services[0].Namespace != "default" || o.Services[0].Spec.Ports[0].TargetPort.IntValue() != 8080 {
		t.Fatalf("services: %+v", o.Services)
	}
	if len(o.ServiceEntries) != 1 || o.ServiceEntries[0].Spec.GetHosts()[0] != "api.example.com" ||
		o.ServiceEntries[0].Status.GetAddresses()[0].GetValue() != "240.240.0.1" {
		t.Fatalf("service entries: %+v", o.ServiceEntries)
	}
	if len(o.AuthorizationPolicies) != 1 || o.AuthorizationPolicies[0].Spec.GetRules()[0].GetFrom()[0].GetSource().GetPrincipals()[0] != "cluster.local/ns/apps/sa/client" {
		t.Fatalf("policies: %+v", o.AuthorizationPolicies)
	}
	if len(o.PeerAuthentications) != 1 || o.PeerAuthentications[0].Spec.GetMtls().GetMode().String() != "STRICT" {
		t.Fatalf("peer authentications: %+v", o.PeerAuthentications)
	}
	if len(o.Gateways) != 1 || o.Gateways[0].Spec.GatewayClassName != "istio-waypoint" {
		t.Fatalf("gateways: %+v", o.Gateways)
	}
}

func TestDecodeErrorsNameFileDocAndField(t *testing.T) {
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"bad yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: [\n", []string{"f.yaml: document 0", "invalid YAML"}},
		{"unknown pod field", "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns1}\nspec: {nodeNme: x}\n", []string{"document 0 (Pod ns1/p)", "nodeNme"}},
		{"wrong type", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {nodeName: [1]}\n", []string{"(Pod p)", "nodeName"}},
		{"unknown istio spec field", "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: se, namespace: ns1}\nspec: {hostz: [a]}\n", []string{"(ServiceEntry ns1/se)", "spec", "hostz"}},
		{"bad enum", "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: ap}\nspec: {action: MAYBE}\n", []string{"AuthorizationPolicy", "MAYBE"}},
		{"missing kind", "apiVersion: v1\nmetadata: {name: x}\n", []string{"missing apiVersion or kind"}},
		{"missing name", "apiVersion: v1\nkind: Namespace\nmetadata: {}\n", []string{"missing metadata.name"}},
		{"not an object", "- a\n- b\n", []string{"not an object"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o cluster.Objects
			errs := cluster.Decode("f.yaml", []byte(tt.doc), &o)
			if len(errs) != 1 {
				t.Fatalf("got %d errors (%v), want 1", len(errs), errs)
			}
			var de *cluster.DocError
			if !errors.As(errs[0], &de) {
				t.Fatalf("error %T is not a DocError", errs[0])
			}
			for _, w := range tt.want {
				if !strings.Contains(errs[0].Error(), w) {
					t.Errorf("error %q lacks %q", errs[0], w)
				}
			}
		})
	}
}

func TestDecodeKeepsGoodDocsBesideBadOnes(t *testing.T) {
	data := "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {bogus: 1}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n"
	var o cluster.Objects
	errs := cluster.Decode("f.yaml", []byte(data), &o)
	if len(errs) != 2 {
		t.Fatalf("errors: %v", errs)
	}
	if !strings.Contains(errs[0].Error(), "document 1") || !errors.Is(errs[1], cluster.ErrUnsupportedKind) || !strings.Contains(errs[1].Error(), "document 2") {
		t.Fatalf("errors: %v", errs)
	}
	if len(o.Namespaces) != 2 {
		t.Fatalf("good documents lost: %+v", o.Namespaces)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("apiVersion: v1\nkind: List\nitems: [{apiVersion: v1, kind: List, items: []}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var o cluster.Objects
		errs := cluster.Decode("fuzz.yaml", data, &o)
		for _, e := range errs {
			if !strings.HasPrefix(e.Error(), "fuzz.yaml: document ") {
				t.Fatalf("error does not name file and document: %v", e)
			}
		}
	})
}

// TestKindsTable: every row of the kinds table decodes a minimal document of
// its kind into its own Objects slice (namespace defaulted only where the kind
// is namespaced), lists it in Items under its kind, and Add puts the object
// back where Decode did. A document of another version of the group decodes
// into the same type.
func TestKindsTable(t *testing.T) {
	var all cluster.Objects
	for _, k := range cluster.Kinds() {
		doc := "apiVersion: " + k.GroupVersion.String() + "\nkind: " + k.Name + "\nmetadata: {name: x}\n"
		var o cluster.Objects
		if errs := cluster.Decode("k.yaml", []byte(doc), &o); len(errs) != 0 {
			t.Fatalf("%s: %v", k.Name, errs)
		}
		items := o.Items()
		wantNS := ""
		if k.Namespaced {
			wantNS = "default"
		}
		if len(items) != 1 || items[0].Key != k.Name+"/"+wantNS+"/x" {
			t.Fatalf("%s: items %+v, want one keyed %s/%s/x", k.Name, items, k.Name, wantNS)
		}
		all.Add(items[0].Obj)
		if gvr := k.GroupVersionResource(); gvr.Group != k.GroupVersion.Group || gvr.Resource == "" {
			t.Fatalf("%s: resource %v", k.Name, gvr)
		}
	}
	seen := map[string]bool{}
	for _, it := range all.Items() {
		kind, _, _ := strings.Cut(it.Key, "/")
		if seen[kind] {
			t.Fatalf("two rows fill the same Objects field: %s listed twice", kind)
		}
		seen[kind] = true
	}
	if len(seen) != len(cluster.Kinds()) {
		t.Fatalf("Add lost kinds: %v", seen)
	}

	var o cluster.Objects
	doc := "apiVersion: security.istio.io/v1beta1\nkind: AuthorizationPolicy\nmetadata: {name: ap, namespace: ns1}\nspec: {action: DENY}\n"
	if errs := cluster.Decode("k.yaml", []byte(doc), &o); len(errs) != 0 || len(o.AuthorizationPolicies) != 1 ||
		o.AuthorizationPolicies[0].Spec.GetAction().String() != "DENY" {
		t.Fatalf("v1beta1 document: %v %+v", errs, o.AuthorizationPolicies)
	}
}

func TestAddPanicsOnUnsupportedType(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "unsupported type") {
			t.Fatalf("recovered %v", r)
		}
	}()
	var o cluster.Objects
	o.Add("not an object")
}

// TestDecodeSecretStringData: a Secret's stringData becomes data, as the
// API server stores it.
func TestDecodeSecretStringData(t *testing.T) {
	var objs cluster.Objects
	doc := "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: ns}\ndata: {ca.crt: QUJD}\nstringData: {tls.crt: CERT}\n"
	if errs := cluster.Decode("s.yaml", []byte(doc), &objs); len(errs) > 0 {
		t.Fatal(errs)
	}
	if len(objs.Secrets) != 1 || string(objs.Secrets[0].Data["ca.crt"]) != "ABC" || string(objs.Secrets[0].Data["tls.crt"]) != "CERT" ||
		objs.Secrets[0].StringData != nil {
		t.Fatalf("secrets %+v", objs.Secrets)
	}
}
