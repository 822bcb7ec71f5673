package controlplane

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate/synth"
)

// BenchmarkApplyNamespaceChange50k: Apply of one namespace's dataplane
// mode flip at 50k pods, with no node clients (bench/cpscale adds them):
// the translation, placement and the hand-off to the xDS server.
func BenchmarkApplyNamespaceChange50k(b *testing.B) {
	s := synth.Default(50000)
	objs := synth.Build(s)
	cp := newLocalControlPlane(b)
	cp.Apply(objs)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		next := synth.With(objs, func(o *cluster.Objects) *[]*corev1.Namespace { return &o.Namespaces }, synth.Namespace(s, (i*7)%s.Namespaces, i+1))
		b.StartTimer()
		cp.Apply(next)
		objs = next
	}
}

// newLocalControlPlane is a control plane over an empty local source with
// its own CA and one node token, for tests and benchmarks that Apply
// objects directly.
func newLocalControlPlane(tb testing.TB) *ControlPlane {
	tb.Helper()
	c, err := ca.New(ca.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	auth, _ := caserver.NewNodeTokens(map[string]string{"node-0": "tok"})
	cp, err := New(Config{Source: local.New(tb.TempDir(), nil, 0), Translate: translate.LocalDefaults(), CA: c, Auth: auth})
	if err != nil {
		tb.Fatal(err)
	}
	return cp
}
