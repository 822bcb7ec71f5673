package translate

import (
	"testing"

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
