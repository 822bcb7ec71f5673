package kubestatus

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

const routeStatusObjects = `
apiVersion: v1
kind: Service
metadata: {name: cart, namespace: shop}
spec: {selector: {app: cart}, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: payments, namespace: shop}
spec: {selector: {app: payments}, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: sink, namespace: evil}
spec: {selector: {app: sink}, ports: [{name: http, port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: good, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: cart}]
  rules: [{backendRefs: [{name: cart, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: extension, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: cart}]
  rules: [{filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Plugin, name: p}}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: missing, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: cart}]
  rules: [{backendRefs: [{name: nope, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: steal, namespace: evil}
spec:
  parentRefs: [{group: "", kind: Service, name: cart, namespace: shop}]
  rules: [{backendRefs: [{name: payments, namespace: shop, port: 80}]}]
`

const routeStatusGrant = `
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: allow-evil, namespace: shop}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: evil}]
  to: [{group: "", kind: Service, name: payments}]
`

// TestHTTPRouteStatusOnAPIServer: on a real API server, the control plane
// writes status.parents under its own controller name, as `kubectl get
// httproute -o yaml` shows it: Accepted/ResolvedRefs with Gateway API's
// reasons for a good route, an unsupported filter (UnsupportedValue), a
// missing backend (BackendNotFound), and a cross-namespace backendRef
// without (RefNotPermitted) and with a ReferenceGrant. Another
// controller's entry is kept; a replica that does not lead writes nothing;
// nothing is written when nothing changed.
func TestHTTPRouteStatusOnAPIServer(t *testing.T) {
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := api.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"shop", "evil"} {
		if err := api.EnsureNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := api.Apply(ctx, []byte(routeStatusObjects), kubeapi.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	clients, err := kube.NewClients(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	gw := clients.Gateway.GatewayV1()
	// Another controller (istiod, say) already reports on "good".
	good, err := gw.HTTPRoutes("shop").Get(ctx, "good", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := gatewayv1.RouteParentStatus{
		ParentRef:      good.Spec.ParentRefs[0],
		ControllerName: "example.com/other-mesh",
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted",
			LastTransitionTime: metav1.Now(), ObservedGeneration: good.Generation}},
	}
	good.Status.Parents = []gatewayv1.RouteParentStatus{other}
	if _, err := gw.HTTPRoutes("shop").UpdateStatus(ctx, good, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	src, err := kube.New(kube.Config{Clients: clients, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = src.Run(rctx) }()
	select {
	case <-src.Synced():
	case <-ctx.Done():
		t.Fatal("source never synced")
	}

	// A replica that does not lead writes nothing.
	follower, err := NewRouteWriter(RouteConfig{Gateway: clients.Gateway, Source: src, Leading: func() bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	fctx, fstop := context.WithTimeout(ctx, 500*time.Millisecond)
	_ = follower.Run(fctx)
	fstop()
	if r, _ := gw.HTTPRoutes("shop").Get(ctx, "missing", metav1.GetOptions{}); len(r.Status.Parents) != 0 {
		t.Fatalf("a follower wrote status: %+v", r.Status.Parents)
	}

	leader, err := NewRouteWriter(RouteConfig{Gateway: clients.Gateway, Source: src, Translate: translate.LocalDefaults()})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = leader.Run(rctx) }()

	type want struct{ accepted, acceptedReason, resolved, resolvedReason string }
	expect := func(ns, name string, w want) {
		t.Helper()
		var last string
		for ctx.Err() == nil {
			r, err := gw.HTTPRoutes(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// What `kubectl get httproute -o yaml` prints.
			y, _ := yaml.Marshal(r.Status)
			last = string(y)
			if got := ourConditions(r.Status.Parents); got == fmt.Sprint(w) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("HTTPRoute %s/%s status, want our entry with %+v:\n%s", ns, name, w, last)
	}
	expect("shop", "good", want{"True", "Accepted", "True", "ResolvedRefs"})
	expect("shop", "extension", want{"False", "UnsupportedValue", "True", "ResolvedRefs"})
	expect("shop", "missing", want{"True", "Accepted", "False", "BackendNotFound"})
	expect("evil", "steal", want{"True", "Accepted", "False", "RefNotPermitted"})

	r, _ := gw.HTTPRoutes("shop").Get(ctx, "good", metav1.GetOptions{})
	if len(r.Status.Parents) != 2 || r.Status.Parents[0].ControllerName != other.ControllerName {
		t.Fatalf("good parents = %+v, want the other controller's entry kept beside ours", r.Status.Parents)
	}
	steal, _ := gw.HTTPRoutes("evil").Get(ctx, "steal", metav1.GetOptions{})
	if msg := steal.Status.Parents[0].Conditions[1].Message; !strings.Contains(msg, "ReferenceGrant") {
		t.Errorf("RefNotPermitted message %q does not name the missing ReferenceGrant", msg)
	}
	if msg := steal.Status.Parents[0].Conditions[0].Message; !strings.Contains(msg, "consumer route") {
		t.Errorf("steal Accepted message %q does not say it is a consumer route", msg)
	}

	// Nothing changed: no write, the resourceVersion stays.
	objs, _ := src.Current()
	if n, failed := leader.Reconcile(ctx, objs); n != 0 || failed != 0 {
		t.Errorf("Reconcile with nothing changed wrote %d (%d failed), want 0", n, failed)
	}
	if again, _ := gw.HTTPRoutes("shop").Get(ctx, "good", metav1.GetOptions{}); again.ResourceVersion != r.ResourceVersion {
		t.Errorf("good rewritten with nothing changed: resourceVersion %s → %s", r.ResourceVersion, again.ResourceVersion)
	}

	// The victim grants the reference: resolved.
	if err := api.Apply(ctx, []byte(routeStatusGrant), kubeapi.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("evil", "steal", want{"True", "Accepted", "True", "ResolvedRefs"})
}

// ourConditions renders our entry's Accepted and ResolvedRefs as the want
// struct prints.
func ourConditions(ps []gatewayv1.RouteParentStatus) string {
	for _, p := range ps {
		if p.ControllerName != translate.RouteControllerName {
			continue
		}
		var a, r metav1.Condition
		for _, c := range p.Conditions {
			switch c.Type {
			case "Accepted":
				a = c
			case "ResolvedRefs":
				r = c
			}
		}
		return fmt.Sprint(struct{ accepted, acceptedReason, resolved, resolvedReason string }{
			string(a.Status), a.Reason, string(r.Status), r.Reason})
	}
	return ""
}
