package translate

import (
	"slices"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// TestRootNamespaceSelectorPolicy: an AuthorizationPolicy with a selector in
// the root namespace selects matching workloads in every namespace, as
// istiod attaches it (a mesh-wide DENY by label); a selector policy in any
// other namespace stays in its namespace.
func TestRootNamespaceSelectorPolicy(t *testing.T) {
	const objsYAML = `
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Namespace
metadata: {name: other, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: demo, labels: {app: web}}
spec: {nodeName: node0, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db, namespace: demo, labels: {app: db}}
spec: {nodeName: node0, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: 10.0.0.2}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: other, labels: {app: web}}
spec: {nodeName: node0, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: 10.0.0.3}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-web, namespace: %ROOT%}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web-only-here, namespace: demo}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{from: [{source: {namespaces: [x]}}]}]
`
	for _, root := range []string{"", "mesh-root"} {
		cfg := Config{RootNamespace: root}.withDefaults()
		var objs cluster.Objects
		y := []byte(strings.ReplaceAll(objsYAML, "%ROOT%", cfg.RootNamespace))
		if errs := cluster.Decode("root.yaml", y, &objs); len(errs) > 0 {
			t.Fatalf("decode: %v", errs)
		}
		objs.Sort()
		res := Translate(cfg, &objs, nil)
		got := map[string][]string{}
		for _, a := range res.Addresses.All() {
			if w := a.GetWorkload(); w != nil {
				got[w.GetNamespace()+"/"+w.GetName()] = w.GetAuthorizationPolicies()
			}
		}
		rootPol := cfg.RootNamespace + "/deny-web"
		for wl, want := range map[string][]string{
			"demo/web":  {"demo/web-only-here", rootPol},
			"other/web": {rootPol},
			"demo/db":   nil,
		} {
			var pols []string
			for _, p := range got[wl] {
				if p == rootPol || p == "demo/web-only-here" {
					pols = append(pols, p)
				}
			}
			slices.Sort(pols)
			slices.Sort(want)
			if !slices.Equal(pols, want) {
				t.Errorf("root %q: %s policies %v, want %v", cfg.RootNamespace, wl, got[wl], want)
			}
		}
		tr := newTranslator(cfg, &objs, nil)
		tr.translateAuthorizationPolicies()
		if p := tr.policiesFor("other", map[string]string{"app": "web"}); !slices.Equal(p, []string{rootPol}) {
			t.Errorf("root %q: policiesFor(other, app=web) = %v", cfg.RootNamespace, p)
		}
	}
}
