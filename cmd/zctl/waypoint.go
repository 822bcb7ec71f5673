package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// Waypoint names, as istioctl waypoint writes them: the ones the control
// plane's translation reads.
const (
	waypointClass    = translate.WaypointClass
	labelWaypointFor = translate.LabelWaypointFor
	labelUseWaypoint = translate.LabelUseWaypoint
)

const waypointAbout = `Manages waypoints as istioctl waypoint does, through the API server:
  apply   create or update a waypoint Gateway (class istio-waypoint) in -n;
          --enroll-namespace also labels the namespace istio.io/use-waypoint;
          --wait waits until the control plane has it Programmed
  list    the waypoints of -n (or -A: every namespace), with their traffic
          type, address and Programmed state
  status  one waypoint's conditions
  delete  delete waypoint Gateways by name (their Deployment and Service go
          with them); a namespace label that names one is removed`

// waypointRow is one waypoint as list and status show it.
type waypointRow struct {
	Namespace  string             `json:"namespace"`
	Name       string             `json:"name"`
	For        string             `json:"for"`
	Address    string             `json:"address,omitempty"`
	Programmed string             `json:"programmed"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

func runWaypoint(args []string, out io.Writer) error {
	var kubeconfig, ns, name, trafficFor, format string
	var all, enroll, wait bool
	s := newSub("waypoint", "apply|list|status|delete [NAME...]", waypointAbout, out)
	s.fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (default: $KUBECONFIG or ~/.kube/config)")
	s.fs.StringVar(&ns, "n", "default", "namespace")
	s.fs.StringVar(&ns, "namespace", "default", "namespace")
	s.fs.StringVar(&name, "name", "waypoint", "apply/status: the waypoint's name")
	s.fs.StringVar(&trafficFor, "for", "service", "apply: traffic the waypoint handles: service, workload, all or none")
	s.fs.BoolVar(&all, "A", false, "list: every namespace")
	s.fs.BoolVar(&enroll, "enroll-namespace", false, "apply: label the namespace to use this waypoint")
	s.fs.BoolVar(&wait, "wait", false, "apply: wait (up to 2 minutes) for the waypoint to be Programmed")
	s.format(&format)
	pos, err := s.parse(args, &format)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		s.fs.Usage()
		return fmt.Errorf("waypoint needs a subcommand: apply, list, status or delete")
	}
	if !slices.Contains([]string{"service", "workload", "all", "none"}, trafficFor) {
		return fmt.Errorf("--for %q: want service, workload, all or none", trafficFor)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	rc.Timeout = 10 * time.Second
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	gc, err := gatewayclient.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := &waypoints{kube: kc, gw: gc, out: out, format: format}
	switch sub := pos[0]; sub {
	case "apply":
		return w.apply(ctx, ns, name, trafficFor, enroll, wait)
	case "list":
		if all {
			ns = ""
		}
		return w.list(ctx, ns, "")
	case "status":
		return w.list(ctx, ns, name)
	case "delete":
		names := pos[1:]
		if len(names) == 0 {
			names = []string{name}
		}
		return w.delete(ctx, ns, names)
	default:
		return fmt.Errorf("unknown waypoint subcommand %q (want apply, list, status or delete)", sub)
	}
}

type waypoints struct {
	kube   kubernetes.Interface
	gw     gatewayclient.Interface
	out    io.Writer
	format string
}

func (w *waypoints) apply(ctx context.Context, ns, name, trafficFor string, enroll, wait bool) error {
	gws := w.gw.GatewayV1().Gateways(ns)
	want := &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{labelWaypointFor: trafficFor}},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: waypointClass, Listeners: []gatewayv1.Listener{{
			Name: "mesh", Port: 15008, Protocol: "HBONE",
		}}},
	}
	cur, err := gws.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := gws.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create waypoint %s/%s: %w", ns, name, err)
		}
		fmt.Fprintf(w.out, "waypoint %s/%s created\n", ns, name)
	case err != nil:
		return fmt.Errorf("get waypoint %s/%s: %w", ns, name, err)
	case string(cur.Spec.GatewayClassName) != waypointClass:
		return fmt.Errorf("Gateway %s/%s exists with class %q, not a waypoint; pick another --name", ns, name, cur.Spec.GatewayClassName)
	default:
		cur.Spec.Listeners = want.Spec.Listeners
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		cur.Labels[labelWaypointFor] = trafficFor
		if _, err := gws.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update waypoint %s/%s: %w", ns, name, err)
		}
		fmt.Fprintf(w.out, "waypoint %s/%s updated\n", ns, name)
	}
	if enroll {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, labelUseWaypoint, name)
		if _, err := w.kube.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label namespace %s: %w", ns, err)
		}
		fmt.Fprintf(w.out, "namespace %s labelled %s=%s\n", ns, labelUseWaypoint, name)
	}
	if !wait {
		return nil
	}
	for {
		gw, err := gws.Get(ctx, name, metav1.GetOptions{})
		if err == nil && rowOf(gw).Programmed == "True" {
			fmt.Fprintf(w.out, "waypoint %s/%s programmed at %s\n", ns, name, rowOf(gw).Address)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waypoint %s/%s not programmed in time: is ztunnel-cp running with --waypoint-image (chart value waypoint.enabled)?", ns, name)
		case <-time.After(time.Second):
		}
	}
}

func rowOf(gw *gatewayv1.Gateway) waypointRow {
	r := waypointRow{Namespace: gw.Namespace, Name: gw.Name, For: gw.Labels[labelWaypointFor], Programmed: "Unknown", Conditions: gw.Status.Conditions}
	if r.For == "" {
		r.For = "service"
	}
	for _, a := range gw.Status.Addresses {
		r.Address = a.Value
		break
	}
	for _, c := range gw.Status.Conditions {
		if c.Type == string(gatewayv1.GatewayConditionProgrammed) {
			r.Programmed = string(c.Status)
		}
	}
	return r
}

// list prints the waypoints of ns ("": all); with name, that one with its
// conditions.
func (w *waypoints) list(ctx context.Context, ns, name string) error {
	gwl, err := w.gw.GatewayV1().Gateways(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list Gateways: %w", err)
	}
	var rows []waypointRow
	for i := range gwl.Items {
		gw := &gwl.Items[i]
		if string(gw.Spec.GatewayClassName) != waypointClass || (name != "" && gw.Name != name) {
			continue
		}
		rows = append(rows, rowOf(gw))
	}
	if name != "" && len(rows) == 0 {
		return fmt.Errorf("no waypoint %s/%s", ns, name)
	}
	slices.SortFunc(rows, func(a, b waypointRow) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	return writeData(w.out, w.format, rows, func() error {
		tw := tabwriter.NewWriter(w.out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAMESPACE\tNAME\tFOR\tADDRESS\tPROGRAMMED")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Name, r.For, orDash(r.Address), r.Programmed)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if name != "" {
			for _, c := range rows[0].Conditions {
				fmt.Fprintf(w.out, "  %s=%s (%s): %s\n", c.Type, c.Status, c.Reason, c.Message)
			}
		}
		return nil
	})
}

func (w *waypoints) delete(ctx context.Context, ns string, names []string) error {
	for _, n := range names {
		gw, err := w.gw.GatewayV1().Gateways(ns).Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("waypoint %s/%s: %w", ns, n, err)
		}
		if string(gw.Spec.GatewayClassName) != waypointClass {
			return fmt.Errorf("Gateway %s/%s is not a waypoint (class %q); not deleted", ns, n, gw.Spec.GatewayClassName)
		}
		if err := w.gw.GatewayV1().Gateways(ns).Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete waypoint %s/%s: %w", ns, n, err)
		}
		fmt.Fprintf(w.out, "waypoint %s/%s deleted\n", ns, n)
		nsObj, err := w.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err == nil && nsObj.Labels[labelUseWaypoint] == n {
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, labelUseWaypoint)
			if _, err := w.kube.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("unlabel namespace %s: %w", ns, err)
			}
			fmt.Fprintf(w.out, "namespace %s no longer uses it (label %s removed)\n", ns, labelUseWaypoint)
		}
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
