package controlplane

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"testing"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate/synth"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// TestNamespaceChangeWaypointConfigs: a namespace change rebuilds only
// the waypoint configs it can change (of the waypoints a changed address
// is or was bound to; all of them when a waypoint's own translation
// changes or a DestinationRule lists workloads), and then serves what a
// control plane that translated the new set from scratch serves; the
// other configs are kept (the same objects, not rebuilt).
func TestNamespaceChangeWaypointConfigs(t *testing.T) {
	s := synth.Spec{Pods: 400, Namespaces: 20, Nodes: 4, PodsPerService: 4, AmbientEvery: 5}
	amb := synth.AmbientNamespaces(s)[1]
	wpKey := synth.NamespaceName(amb) + "/waypoint"
	const plain = 3 // neither ambient nor with a waypoint
	if synth.Namespace(s, plain, 0).Labels[translate.LabelUseWaypoint] != "" {
		t.Fatalf("namespace %d has a waypoint", plain)
	}
	// relabel is namespace n at generation gen with labels changed by f.
	relabel := func(n, gen int, f func(map[string]string)) func(*cluster.Objects) *cluster.Objects {
		return func(o *cluster.Objects) *cluster.Objects {
			ns := synth.Namespace(s, n, gen)
			f(ns.Labels)
			return synth.With(o, func(o *cluster.Objects) *[]*corev1.Namespace { return &o.Namespaces }, ns)
		}
	}
	keep := func(map[string]string) {}
	dr := &networkingv1.DestinationRule{
		ObjectMeta: metav1.ObjectMeta{Name: "subsets", Namespace: synth.NamespaceName(amb)},
		Spec: networkingv1alpha3.DestinationRule{
			Host:    synth.DeploymentName(amb) + "." + synth.NamespaceName(amb) + ".svc.cluster.local",
			Subsets: []*networkingv1alpha3.Subset{{Name: "v1", Labels: map[string]string{"version": "v1"}}},
		},
	}
	steps := []struct {
		name    string
		next    func(*cluster.Objects) *cluster.Objects
		rebuilt string // "": none; "all"; else the one waypoint rebuilt
	}{
		{"unrelated namespace joins the mesh", relabel(plain, 1, keep), ""},
		{"unrelated label on a waypoint's namespace", relabel(amb, 0, func(l map[string]string) { l["team"] = "other" }), ""},
		{"waypoint's namespace leaves the mesh", relabel(amb, 1, keep), ""},
		{"waypoint's namespace back in the mesh", relabel(amb, 2, keep), ""},
		{"use-waypoint removed", relabel(amb, 2, func(l map[string]string) { delete(l, translate.LabelUseWaypoint) }), wpKey},
		{"unrelated namespace leaves the mesh", relabel(plain, 2, keep), ""},
		{"use-waypoint back", relabel(amb, 2, keep), wpKey},
		{"network of the waypoint's namespace", relabel(amb, 2, func(l map[string]string) { l[translate.LabelNetwork] = "net-b" }), "all"},
		{"network back", relabel(amb, 2, keep), "all"},
		// The waypoint admits its own namespace only (allowedRoutes):
		// nothing binds.
		{"use-waypoint of another namespace's waypoint", relabel(plain, 2, func(l map[string]string) {
			l[translate.LabelUseWaypoint], l[translate.LabelUseWaypointNamespace] = "waypoint", synth.NamespaceName(amb)
		}), ""},
		// The port's name is in the config, not in the Service's
		// address (the protocol, from the name's prefix, stays).
		{"bound Service's port renamed", func(o *cluster.Objects) *cluster.Objects {
			for _, svc := range o.Services {
				if svc.Namespace == synth.NamespaceName(amb) {
					renamed := svc.DeepCopy()
					renamed.ResourceVersion = "renamed"
					renamed.Spec.Ports[0].Name = "http-renamed"
					return synth.With(o, func(o *cluster.Objects) *[]*corev1.Service { return &o.Services }, renamed)
				}
			}
			t.Fatal("no Service in the waypoint's namespace")
			return nil
		}, wpKey},
		{"a DestinationRule (its subsets list workloads)", func(o *cluster.Objects) *cluster.Objects {
			next := *o
			next.DestinationRules = []*networkingv1.DestinationRule{dr}
			return &next
		}, "all"},
		{"unrelated namespace while a DestinationRule exists", relabel(plain, 3, keep), "all"},
	}
	objs := synth.Build(s)
	inc := newLocalControlPlane(t)
	inc.Apply(objs)
	if inc.wps[wpKey] == nil {
		t.Fatalf("no waypoint config %s", wpKey)
	}
	for _, st := range steps {
		prev := maps.Clone(inc.wps)
		objs = st.next(objs)
		inc.Apply(objs)
		if got := rebuiltOf(prev, inc.wps); got != st.rebuilt {
			t.Errorf("%s: configs rebuilt %q, want %q", st.name, got, st.rebuilt)
		}
		full := newLocalControlPlane(t)
		full.Apply(objs)
		if got, want := inc.XDS().Versions(xds.WaypointType), full.XDS().Versions(xds.WaypointType); !maps.Equal(got, want) {
			t.Errorf("%s: waypoint configs served differ from a full translation's:\n got %v\nwant %v", st.name, got, want)
		}
		if got, want := inc.Result().Policies, full.Result().Policies; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: policy statuses differ from a full translation's:\n got %+v\nwant %+v", st.name, got, want)
		}
	}
}

// rebuiltOf says which configs of b are not a's objects: "" none, "all",
// the key of the one, or "several".
func rebuiltOf(a, b map[string]*waypointapi.Config) string {
	var keys []string
	for k, c := range b {
		if a[k] != c {
			keys = append(keys, k)
		}
	}
	switch {
	case len(keys) == 0:
		return ""
	case len(keys) == len(b) && len(b) > 1:
		return "all"
	case len(keys) == 1:
		return keys[0]
	}
	return "several"
}

// TestRandomNamespaceChangesWaypointConfigs: after every one of a random
// sequence of namespace label changes (dataplane mode, use-waypoint of
// this or another namespace's waypoint, network, an unread label) and pod
// changes, the waypoint configs and policy statuses served equal those of
// a control plane that translated the set from scratch, whether they were
// all rebuilt, some or none.
func TestRandomNamespaceChangesWaypointConfigs(t *testing.T) {
	s := synth.Spec{Pods: 400, Namespaces: 20, Nodes: 4, PodsPerService: 4, AmbientEvery: 5}
	ambient := synth.AmbientNamespaces(s)
	rnd := rand.New(rand.NewPCG(29, 1))
	objs := synth.Build(s)
	inc := newLocalControlPlane(t)
	inc.Apply(objs)
	kept, partial := 0, 0
	for step := range 120 {
		var what string
		if rnd.IntN(5) == 0 {
			i := rnd.IntN(s.Pods)
			what = fmt.Sprintf("pod %d", i)
			objs = synth.WithPod(objs, s, i, step+1)
		} else {
			n := rnd.IntN(s.Namespaces)
			ns := synth.Namespace(s, n, rnd.IntN(2))
			switch rnd.IntN(5) {
			case 0:
				delete(ns.Labels, translate.LabelUseWaypoint)
			case 1:
				w := ambient[rnd.IntN(len(ambient))]
				ns.Labels[translate.LabelUseWaypoint], ns.Labels[translate.LabelUseWaypointNamespace] = "waypoint", synth.NamespaceName(w)
			case 2:
				ns.Labels[translate.LabelNetwork] = fmt.Sprintf("net-%d", rnd.IntN(2))
			case 3:
				ns.Labels["team"] = fmt.Sprintf("t%d", rnd.IntN(3))
			}
			what = fmt.Sprintf("namespace %s %v", ns.Name, ns.Labels)
			objs = synth.With(objs, func(o *cluster.Objects) *[]*corev1.Namespace { return &o.Namespaces }, ns)
		}
		prev := maps.Clone(inc.wps)
		inc.Apply(objs)
		switch rebuiltOf(prev, inc.wps) {
		case "":
			kept++
		case "all":
		default:
			partial++
		}
		full := newLocalControlPlane(t)
		full.Apply(objs)
		if got, want := inc.XDS().Versions(xds.WaypointType), full.XDS().Versions(xds.WaypointType); !maps.Equal(got, want) {
			t.Fatalf("step %d (%s): waypoint configs served differ from a full translation's", step, what)
		}
		if got, want := inc.Result().Policies, full.Result().Policies; !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d (%s): policy statuses differ from a full translation's", step, what)
		}
	}
	if kept == 0 || partial == 0 {
		t.Errorf("%d changes kept every config, %d rebuilt some: the test checks too little", kept, partial)
	}
	t.Logf("of 120 changes, %d kept every config, %d rebuilt some only", kept, partial)
}
