package controlplane

import (
	"maps"
	"slices"
	"testing"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate/synth"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// TestApplyGlobalChangesMatchFull: after each change of a kind the
// translation redoes in part (namespace, policy, PeerAuthentication,
// ServiceEntry, route, a policy removed), the xDS server of a control
// plane that applied every change serves exactly what one that applied
// only the final set serves: addresses, Authorizations (pushed by
// difference) and waypoint configs.
func TestApplyGlobalChangesMatchFull(t *testing.T) {
	s := synth.Spec{Pods: 400, Namespaces: 20, Nodes: 4, PodsPerService: 4, AmbientEvery: 5}
	objs := synth.Build(s)
	newCP := func() *ControlPlane { return newLocalControlPlane(t) }
	withoutPolicy := func(o *cluster.Objects, ns string) *cluster.Objects {
		next := *o
		next.AuthorizationPolicies = slices.DeleteFunc(slices.Clone(o.AuthorizationPolicies), func(ap *securityv1.AuthorizationPolicy) bool { return ap.Namespace == ns })
		return &next
	}
	amb := synth.AmbientNamespaces(s)[1]
	steps := []struct {
		name string
		next func(*cluster.Objects) *cluster.Objects
	}{
		{"namespace", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*corev1.Namespace { return &o.Namespaces }, synth.Namespace(s, amb, 1))
		}},
		{"policy", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*securityv1.AuthorizationPolicy { return &o.AuthorizationPolicies }, synth.Policy(s, 3, 1))
		}},
		{"peerauthn", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*securityv1.PeerAuthentication { return &o.PeerAuthentications }, synth.PeerAuthentication(s, synth.PeerAuthnNamespaces(s)[0], 1))
		}},
		{"serviceentry", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*networkingv1.ServiceEntry { return &o.ServiceEntries }, synth.ServiceEntry(s, synth.ServiceEntryNamespaces(s)[0], 1))
		}},
		{"route", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*gatewayv1.HTTPRoute { return &o.HTTPRoutes }, synth.Route(s, amb, 1))
		}},
		{"policy removed", func(o *cluster.Objects) *cluster.Objects { return withoutPolicy(o, synth.NamespaceName(4)) }},
		{"namespace back", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*corev1.Namespace { return &o.Namespaces }, synth.Namespace(s, amb, 2))
		}},
	}
	inc := newCP()
	inc.Apply(objs)
	for _, st := range steps {
		objs = st.next(objs)
		inc.Apply(objs)
		full := newCP()
		full.Apply(objs)
		for _, typ := range []string{xds.AddressType, xds.AuthorizationType, xds.WaypointType} {
			got, want := inc.XDS().Versions(typ), full.XDS().Versions(typ)
			if !maps.Equal(got, want) {
				t.Errorf("after %s: %s: %d resources served, want %d as after a full translation (or versions differ)", st.name, typ, len(got), len(want))
			}
		}
	}
}
