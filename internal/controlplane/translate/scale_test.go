package translate

import (
	"testing"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate/synth"
)

// Benchmarks of one translation of the synthetic 50k-pod cluster, and of
// one pod change after it (bench/cpscale reports both end to end).
func BenchmarkTranslateFull50k(b *testing.B) {
	objs := synth.Build(synth.Default(50000))
	b.ResetTimer()
	for range b.N {
		NewTranslator(LocalDefaults()).Update(objs, nil)
	}
}

func BenchmarkTranslatePodChange50k(b *testing.B) {
	s := synth.Default(50000)
	objs := synth.Build(s)
	tr := NewTranslator(LocalDefaults())
	tr.Update(objs, nil)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		next := synth.WithPod(objs, s, (i*7919)%s.Pods, i+1)
		b.StartTimer()
		tr.Update(next, nil)
		objs = next
	}
}

// BenchmarkMergeRemotePodChange50k: one pod change in a remote cluster of
// 50k pods, on another network, whose services are all global (a GLOBAL
// serviceScopeConfigs entry matching everything) and exist here too: it
// costs that pod's workload, not the remote cluster.
func BenchmarkMergeRemotePodChange50k(b *testing.B) {
	s := synth.Default(50000)
	objs := synth.Build(s)
	cfg := LocalDefaults()
	cfg.ServiceScopeConfigs = []*meshv1alpha1.MeshConfig_ServiceScopeConfigs{{Scope: meshv1alpha1.MeshConfig_ServiceScopeConfigs_GLOBAL}}
	// The same objects on both sides: on one network every remote pod
	// would have a local pod's address (and be withheld).
	cfg.Network = "east"
	tr, m := NewTranslator(cfg), NewMerger(cfg)
	res, ch := tr.Update(objs, nil)
	out, _ := m.Merge(res, ch, objs, []RemoteCluster{{ID: "west", Objs: objs}})
	if out.Addresses.Len() < 2*s.Pods {
		b.Fatalf("%d addresses, want the remote workloads merged too", out.Addresses.Len())
	}
	remote := objs
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		next := synth.WithPod(remote, s, (i*7919)%s.Pods, i+1)
		b.StartTimer()
		res, ch := tr.Update(objs, nil)
		_, mch := m.Merge(res, ch, objs, []RemoteCluster{{ID: "west", Objs: next}})
		if mch.Full || len(mch.Addresses)+len(mch.Removed) > 2 {
			b.Fatalf("one remote pod changed: full=%v, %d pushed", mch.Full, len(mch.Addresses)+len(mch.Removed))
		}
		remote = next
	}
}

// BenchmarkTranslateNamespaceChange50k: one namespace's dataplane mode
// flips (bench/cpscale's namespace series): that namespace's pods and
// Services, plus the global unit.
func BenchmarkTranslateNamespaceChange50k(b *testing.B) {
	s := synth.Default(50000)
	objs := synth.Build(s)
	tr := NewTranslator(LocalDefaults())
	tr.Update(objs, nil)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		next := synth.With(objs, func(o *cluster.Objects) *[]*corev1.Namespace { return &o.Namespaces }, synth.Namespace(s, (i*7)%s.Namespaces, i+1))
		b.StartTimer()
		if _, ch := tr.Update(next, nil); ch.Full {
			b.Fatalf("full translation: %s", ch.Reason)
		}
		objs = next
	}
}
