package translate

import (
	"testing"

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
