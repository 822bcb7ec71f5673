package controlplane

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate/synth"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// TestRandomPolicyChanges: after every one of a random sequence of
// AuthorizationPolicy and PeerAuthentication changes (selectors that match
// some, all or none of a namespace's pods, namespace-wide and root
// namespace ones, actions, mTLS modes, objects added and removed, now and
// then a policy with targetRefs to a waypoint, and pod changes between
// them), the addresses, Authorizations and waypoint configs served and
// the policy statuses equal those of a control plane that translated the
// set from scratch, whether the waypoint configs were rebuilt or kept.
func TestRandomPolicyChanges(t *testing.T) {
	s := synth.Spec{Pods: 400, Namespaces: 20, Nodes: 4, PodsPerService: 4, AmbientEvery: 5}
	ambient := synth.AmbientNamespaces(s)
	rnd := rand.New(rand.NewPCG(31, 7))
	objs := synth.Build(s)
	inc := newLocalControlPlane(t)
	inc.Apply(objs)
	nsName := func() string {
		if rnd.IntN(8) == 0 {
			return "istio-system" // the root namespace: every namespace's pods
		}
		return synth.NamespaceName(rnd.IntN(s.Namespaces))
	}
	selector := func(ns string) map[string]string {
		switch rnd.IntN(5) {
		case 0:
			return nil // namespace-wide
		case 1:
			return map[string]string{"version": "v1"} // every pod
		case 2:
			return map[string]string{"version": "v2"} // none
		}
		// One deployment of the namespace (or of another one: none).
		return map[string]string{"app": synth.DeploymentName(rnd.IntN(s.Pods / s.PodsPerService))}
	}
	kept := 0
	for step := range 150 {
		var what string
		switch r := rnd.IntN(10); {
		case r == 0:
			i := rnd.IntN(s.Pods)
			what = fmt.Sprintf("pod %d", i)
			objs = synth.WithPod(objs, s, i, step+1)
		case r < 6:
			ns := nsName()
			ap := &securityv1.AuthorizationPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ap-%d", rnd.IntN(2)), Namespace: ns},
				Spec: securityv1beta1.AuthorizationPolicy{
					Action: []securityv1beta1.AuthorizationPolicy_Action{securityv1beta1.AuthorizationPolicy_ALLOW,
						securityv1beta1.AuthorizationPolicy_DENY, securityv1beta1.AuthorizationPolicy_AUDIT}[rnd.IntN(3)],
					Rules: []*securityv1beta1.Rule{{
						From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{Namespaces: []string{synth.NamespaceName(rnd.IntN(s.Namespaces))}}}},
						To:   []*securityv1beta1.Rule_To{{Operation: &securityv1beta1.Operation{Ports: []string{fmt.Sprint(8080 + rnd.IntN(2))}}}},
					}},
				},
			}
			if sel := selector(ns); sel != nil {
				ap.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: sel}
			}
			if rnd.IntN(4) == 0 {
				// Attached to a waypoint: its config carries it, and an
				// edit of its rules changes neither the policies attached
				// nor its status.
				w := synth.NamespaceName(ambient[rnd.IntN(2)])
				ap.Namespace, ap.Name, ap.Spec.Selector = w, "wp", nil
				ap.Spec.TargetRefs = []*typev1beta1.PolicyTargetReference{{Group: "gateway.networking.k8s.io", Kind: "Gateway", Name: "waypoint"}}
			}
			what = fmt.Sprintf("AuthorizationPolicy %s/%s", ap.Namespace, ap.Name)
			apNs, apName := ap.Namespace, ap.Name
			if rnd.IntN(4) == 0 {
				what += " removed"
				ap = nil
			}
			objs = withObject(objs, func(o *cluster.Objects) *[]*securityv1.AuthorizationPolicy { return &o.AuthorizationPolicies }, apNs, apName, ap)
		default:
			ns := nsName()
			pa := &securityv1.PeerAuthentication{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pa-%d", rnd.IntN(2)), Namespace: ns},
				Spec: securityv1beta1.PeerAuthentication{Mtls: &securityv1beta1.PeerAuthentication_MutualTLS{
					Mode: []securityv1beta1.PeerAuthentication_MutualTLS_Mode{securityv1beta1.PeerAuthentication_MutualTLS_STRICT,
						securityv1beta1.PeerAuthentication_MutualTLS_PERMISSIVE, securityv1beta1.PeerAuthentication_MutualTLS_DISABLE,
						securityv1beta1.PeerAuthentication_MutualTLS_UNSET}[rnd.IntN(4)],
				}},
			}
			if sel := selector(ns); sel != nil && ns != "istio-system" {
				pa.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: sel}
			}
			what = fmt.Sprintf("PeerAuthentication %s/%s %v", pa.Namespace, pa.Name, pa.Spec.Mtls.Mode)
			paName := pa.Name
			if rnd.IntN(4) == 0 {
				what += " removed"
				pa = nil
			}
			objs = withObject(objs, func(o *cluster.Objects) *[]*securityv1.PeerAuthentication { return &o.PeerAuthentications }, ns, paName, pa)
		}
		prev := maps.Clone(inc.wps)
		inc.Apply(objs)
		if rebuiltOf(prev, inc.wps) == "" {
			kept++
		}
		full := newLocalControlPlane(t)
		full.Apply(objs)
		for _, typ := range []string{xds.AddressType, xds.AuthorizationType, xds.WaypointType} {
			if got, want := inc.XDS().Versions(typ), full.XDS().Versions(typ); !maps.Equal(got, want) {
				t.Fatalf("step %d (%s): %s served differ from a full translation's", step, what, typ)
			}
		}
		if got, want := inc.Result().Policies, full.Result().Policies; !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d (%s): policy statuses differ from a full translation's", step, what)
		}
		if got, want := inc.Result().Warnings, full.Result().Warnings; !slices.Equal(got, want) {
			t.Fatalf("step %d (%s): warnings differ from a full translation's:\n got %q\nwant %q", step, what, got, want)
		}
	}
	if kept == 0 {
		t.Errorf("no change kept the waypoint configs: the test checks too little")
	}
	t.Logf("of 150 changes, %d kept every waypoint config", kept)
}

// withObject returns a copy of objs (sharing every object) in which the
// object ns/name of the slice field picks is o, or is absent when o is
// nil, the way a Source publishes after an update, add or delete.
func withObject[T interface {
	comparable
	GetNamespace() string
	GetName() string
}](objs *cluster.Objects, field func(*cluster.Objects) *[]T, ns, name string, o T) *cluster.Objects {
	next := *objs
	s := field(&next)
	var zero T
	list := slices.DeleteFunc(slices.Clone(*s), func(c T) bool { return c.GetNamespace() == ns && c.GetName() == name })
	if o != zero {
		list = append(list, o)
	}
	slices.SortFunc(list, func(a, b T) int {
		if a.GetNamespace() != b.GetNamespace() {
			if a.GetNamespace() < b.GetNamespace() {
				return -1
			}
			return 1
		}
		if a.GetName() < b.GetName() {
			return -1
		}
		if a.GetName() > b.GetName() {
			return 1
		}
		return 0
	})
	*s = list
	return &next
}
