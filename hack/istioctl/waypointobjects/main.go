// Command waypointobjects prints, as YAML documents, the objects our
// waypoint controller (internal/controlplane/waypointctl) applies for a
// Gateway <namespace>/waypoint of class istio-waypoint: its
// ServiceAccount, Service and Deployment, built in or (with -template and
// -values) from a Deployment template. It reconciles against fake API
// clients. TestIstioctlAnalyzeOurObjects runs it: a separate binary,
// because our WDS protos and istio's register the same proto file and
// cannot be linked into one.
//
//	waypointobjects -namespace shop [-template deployment.yaml -values values.yaml]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayfake "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/fake"
	"sigs.k8s.io/yaml"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/waypointctl"
)

func main() {
	ns := flag.String("namespace", "default", "the Gateway's namespace")
	tmpl := flag.String("template", "", "waypoint Deployment template (the chart's files/waypoint-deployment.yaml); empty: built in")
	values := flag.String("values", "", "the template's values (YAML)")
	flag.Parse()
	if err := run(*ns, *tmpl, *values); err != nil {
		fmt.Fprintln(os.Stderr, "waypointobjects:", err)
		os.Exit(1)
	}
}

func run(ns, tmpl, values string) error {
	ctx := context.Background()
	gw := &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "waypoint", UID: "gw-uid-1", Generation: 1},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: "istio-waypoint",
			Listeners: []gatewayv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}}},
	}
	kube := kubefake.NewClientset()
	c, err := waypointctl.New(waypointctl.Config{Kube: kube, Gateway: gatewayfake.NewClientset(gw), Source: nopSource{},
		Image: "registry.example/waypoint:0.1.0", XDSAddress: "ztunnel-cp.istio-system.svc:15012",
		TemplateFile: tmpl, ValuesFile: values})
	if err != nil {
		return err
	}
	c.Reconcile(ctx, &cluster.Objects{Gateways: []*gatewayv1.Gateway{gw}})
	sas, err := kube.CoreV1().ServiceAccounts(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	svcs, err := kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	deps, err := kube.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if len(sas.Items) != 1 || len(svcs.Items) != 1 || len(deps.Items) != 1 {
		return fmt.Errorf("%d accounts, %d services, %d deployments applied (want one each)", len(sas.Items), len(svcs.Items), len(deps.Items))
	}
	for _, o := range []struct {
		gvk schema.GroupVersionKind
		obj runtime.Object
	}{
		{schema.GroupVersionKind{Version: "v1", Kind: "ServiceAccount"}, &sas.Items[0]},
		{schema.GroupVersionKind{Version: "v1", Kind: "Service"}, &svcs.Items[0]},
		{schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, &deps.Items[0]},
	} {
		o.obj.GetObjectKind().SetGroupVersionKind(o.gvk)
		b, err := yaml.Marshal(o.obj)
		if err != nil {
			return err
		}
		fmt.Printf("---\n%s", b)
	}
	return nil
}

// nopSource: Reconcile is called directly; Run (which reads the source)
// is not.
type nopSource struct{}

func (nopSource) Run(ctx context.Context) error { <-ctx.Done(); return nil }

func (nopSource) Current() (*cluster.Objects, <-chan struct{}) { return nil, nil }
