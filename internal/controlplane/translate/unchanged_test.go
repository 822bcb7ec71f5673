package translate

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	securityv1beta1 "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate/synth"
)

// TestUnchangedRetranslationKeepsResources: a namespace change that alters
// nothing its pods and Services read (a label no translation reads)
// re-translates them, but lists none of them as changed and keeps the
// very resources of the previous Result (nothing to copy or push); a
// dataplane mode flip lists every pod of the namespace. Both equal a full
// translation.
func TestUnchangedRetranslationKeepsResources(t *testing.T) {
	s := synth.Spec{Pods: 400, Namespaces: 20, Nodes: 4, PodsPerService: 4, AmbientEvery: 5}
	objs := synth.Build(s)
	tr := NewTranslator(LocalDefaults())
	tr.Update(objs, nil)
	const n = 3
	nsName := synth.NamespaceName(n)
	withNs := func(o *cluster.Objects, ns *corev1.Namespace) *cluster.Objects {
		return synth.With(o, func(o *cluster.Objects) *[]*corev1.Namespace { return &o.Namespaces }, ns)
	}
	podsOf := func(o *cluster.Objects) int {
		c := 0
		for _, p := range o.Pods {
			if p.Namespace == nsName {
				c++
			}
		}
		return c
	}

	relabelled := synth.Namespace(s, n, 0)
	relabelled.Labels["team"] = "other"
	before := tr.Result()
	next := withNs(objs, relabelled)
	res, ch := tr.Update(next, nil)
	if ch.Full || !ch.Global || podsOf(next) == 0 || ch.Pods < podsOf(next) {
		t.Fatalf("relabel: full=%v global=%v, %d pods translated; want the namespace's %d re-translated", ch.Full, ch.Global, ch.Pods, podsOf(next))
	}
	if len(ch.Addresses) != 0 || len(ch.Removed) != 0 {
		t.Errorf("relabel: %d addresses listed changed, %d removed; want none", len(ch.Addresses), len(ch.Removed))
	}
	for k, a := range res.Addresses.All() {
		if old, _ := before.Addresses.Get(k); old != a {
			t.Fatalf("relabel: %s is a new resource, want the previous one kept", k)
		}
	}
	if !sameResult(res, Translate(LocalDefaults(), next, nil)) {
		t.Fatalf("relabel: result differs from a full translation")
	}

	next = withNs(next, synth.Namespace(s, n, 1))
	res, ch = tr.Update(next, nil)
	workloads := 0
	for _, a := range ch.Addresses {
		if a.GetWorkload() != nil {
			workloads++
		}
	}
	if workloads != podsOf(next) {
		t.Errorf("flip: %d workloads listed changed, want the namespace's %d pods", workloads, podsOf(next))
	}
	if !sameResult(res, Translate(LocalDefaults(), next, nil)) {
		t.Fatalf("flip: result differs from a full translation")
	}
}

// TestNamespaceChangeKeepsPolicyTranslation: a namespace change takes the
// policies' translation (Authorizations, statuses, warnings) from the
// previous one when no policy kind changed, and translates them again
// after a PeerAuthentication change; every step equals a full
// translation, warnings of the kept policies included.
func TestNamespaceChangeKeepsPolicyTranslation(t *testing.T) {
	s := synth.Spec{Pods: 400, Namespaces: 20, Nodes: 4, PodsPerService: 4, AmbientEvery: 5}
	objs := synth.Build(s)
	custom := synth.Policy(s, 4, 0).DeepCopy()
	custom.Name = "custom"
	custom.Spec.Action = securityv1beta1.AuthorizationPolicy_CUSTOM
	objs.AuthorizationPolicies = append(slices.Clone(objs.AuthorizationPolicies), custom)
	objs.Sort()
	tr := NewTranslator(LocalDefaults())
	first, _ := tr.Update(objs, nil)
	if !slices.ContainsFunc(first.Warnings, func(w string) bool { return strings.Contains(w, "custom") }) {
		t.Fatalf("no warning of the CUSTOM policy: %q", first.Warnings)
	}
	withNs := func(o *cluster.Objects, n, gen int) *cluster.Objects {
		return synth.With(o, func(o *cluster.Objects) *[]*corev1.Namespace { return &o.Namespaces }, synth.Namespace(s, n, gen))
	}
	steps := []struct {
		name string
		next func(*cluster.Objects) *cluster.Objects
		kept bool
	}{
		{"namespace", func(o *cluster.Objects) *cluster.Objects { return withNs(o, 3, 1) }, true},
		{"peerauthn", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*securityv1.PeerAuthentication { return &o.PeerAuthentications },
				synth.PeerAuthentication(s, synth.PeerAuthnNamespaces(s)[0], 1))
		}, false},
		{"namespace again", func(o *cluster.Objects) *cluster.Objects { return withNs(o, 3, 2) }, true},
	}
	for _, st := range steps {
		before := tr.Result()
		objs = st.next(objs)
		res, ch := tr.Update(objs, nil)
		if ch.Full || !ch.Global {
			t.Fatalf("%s: full=%v global=%v", st.name, ch.Full, ch.Global)
		}
		if kept := reflect.ValueOf(res.Authorizations).UnsafePointer() == reflect.ValueOf(before.Authorizations).UnsafePointer(); kept != st.kept {
			t.Errorf("%s: Authorizations kept %v, want %v", st.name, kept, st.kept)
		}
		if !sameResult(res, Translate(LocalDefaults(), objs, nil)) {
			t.Fatalf("%s: result differs from a full translation", st.name)
		}
	}
}
