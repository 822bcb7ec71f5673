package controlplane

import (
	"testing"

	securityv1 "istio.io/client-go/pkg/apis/security/v1"
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

// BenchmarkApplyPolicyChange50k: Apply of one namespace's
// AuthorizationPolicy edit (its selector's version flips) at 50k pods,
// round-robin over the namespaces, as bench/cpscale's policy kind.
func BenchmarkApplyPolicyChange50k(b *testing.B) {
	s := synth.Default(50000)
	benchApplyChanges(b, s, nil, func(o *cluster.Objects, n, gen int) *cluster.Objects {
		return synth.With(o, func(o *cluster.Objects) *[]*securityv1.AuthorizationPolicy { return &o.AuthorizationPolicies }, synth.Policy(s, n, gen))
	})
}

// BenchmarkApplyPeerAuthnChange50k: Apply of one namespace's
// PeerAuthentication edit (its mTLS mode flips) at 50k pods, round-robin
// over the namespaces that have one, as bench/cpscale's peerauthn kind.
func BenchmarkApplyPeerAuthnChange50k(b *testing.B) {
	s := synth.Default(50000)
	benchApplyChanges(b, s, synth.PeerAuthnNamespaces(s), func(o *cluster.Objects, n, gen int) *cluster.Objects {
		return synth.With(o, func(o *cluster.Objects) *[]*securityv1.PeerAuthentication { return &o.PeerAuthentications }, synth.PeerAuthentication(s, n, gen))
	})
}

// benchApplyChanges applies with(objs, n, gen) per iteration, n going
// round-robin over nss (nil: every namespace of s), gen counting that
// namespace's changes.
func benchApplyChanges(b *testing.B, s synth.Spec, nss []int, with func(o *cluster.Objects, n, gen int) *cluster.Objects) {
	if nss == nil {
		for n := range s.Namespaces {
			nss = append(nss, n)
		}
	}
	objs := synth.Build(s)
	cp := newLocalControlPlane(b)
	cp.Apply(objs)
	gens := map[int]int{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		n := nss[i%len(nss)]
		gens[n]++
		next := with(objs, n, gens[n])
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
