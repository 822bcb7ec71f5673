package translate

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate/synth"
)

// mutate returns a copy of objs with one random change to a pod, Service
// or EndpointSlice (changed, removed, or re-added from the original set),
// sometimes to another kind, sorted as a Source publishes.
func mutate(r *rand.Rand, objs, orig *cluster.Objects) *cluster.Objects {
	next := *objs
	labelValues := []string{"a", "b", "web", "db", "svc-1", "none", "ambient"}
	pick := func(n int) int { return r.IntN(n) }
	switch pick(16) {
	case 0, 1, 2, 3: // pod
		next.Pods = clone(objs.Pods)
		if len(next.Pods) == 0 || pick(6) == 0 {
			if len(orig.Pods) > 0 {
				p := orig.Pods[pick(len(orig.Pods))].DeepCopy()
				p.Name += fmt.Sprintf("-x%d", pick(3))
				next.Pods = dedupeByKey(append(next.Pods, p))
			}
			break
		}
		i := pick(len(next.Pods))
		if pick(5) == 0 {
			next.Pods = append(next.Pods[:i], next.Pods[i+1:]...)
			break
		}
		p := next.Pods[i].DeepCopy()
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		switch pick(4) {
		case 0:
			p.Labels["app"] = labelValues[pick(len(labelValues))]
		case 1:
			p.Labels["istio.io/dataplane-mode"] = labelValues[pick(len(labelValues))]
		case 2:
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
		default:
			p.Status.PodIP, p.Status.PodIPs = "", nil
		}
		next.Pods[i] = p
	case 4, 5: // service
		next.Services = clone(objs.Services)
		if len(next.Services) == 0 || pick(5) == 0 {
			if len(orig.Services) > 0 {
				next.Services = append(next.Services, orig.Services[pick(len(orig.Services))])
				next.Services = dedupeByKey(next.Services)
			}
			break
		}
		i := pick(len(next.Services))
		if pick(4) == 0 {
			next.Services = append(next.Services[:i], next.Services[i+1:]...)
			break
		}
		s := next.Services[i].DeepCopy()
		if len(s.Spec.Selector) > 0 && pick(3) == 0 {
			s.Spec.Selector = nil
		} else {
			s.Spec.Selector = map[string]string{"app": labelValues[pick(len(labelValues))]}
		}
		next.Services[i] = s
	case 6, 7: // slice
		next.EndpointSlices = clone(objs.EndpointSlices)
		if len(next.EndpointSlices) == 0 || pick(5) == 0 {
			if len(orig.EndpointSlices) > 0 {
				next.EndpointSlices = append(next.EndpointSlices, orig.EndpointSlices[pick(len(orig.EndpointSlices))])
				next.EndpointSlices = dedupeByKey(next.EndpointSlices)
			}
			break
		}
		i := pick(len(next.EndpointSlices))
		if pick(4) == 0 {
			next.EndpointSlices = append(next.EndpointSlices[:i], next.EndpointSlices[i+1:]...)
			break
		}
		es := next.EndpointSlices[i].DeepCopy()
		if len(es.Endpoints) > 0 {
			e := &es.Endpoints[pick(len(es.Endpoints))]
			if len(objs.Pods) > 0 && pick(2) == 0 {
				p := objs.Pods[pick(len(objs.Pods))]
				e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: p.Name}
			} else {
				e.TargetRef = nil
			}
		} else {
			ready := true
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.9.9.9"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
		}
		next.EndpointSlices[i] = es
	case 8: // a namespace label (global)
		next.Namespaces = clone(objs.Namespaces)
		if len(next.Namespaces) > 0 {
			i := pick(len(next.Namespaces))
			n := next.Namespaces[i].DeepCopy()
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			switch pick(3) {
			case 0:
				n.Labels[LabelUseWaypoint] = []string{"waypoint", "none", "missing"}[pick(3)]
			case 1:
				n.Labels["team"] = labelValues[pick(len(labelValues))]
			default:
				n.Labels["istio.io/dataplane-mode"] = labelValues[pick(len(labelValues))]
			}
			next.Namespaces[i] = n
		}
	case 9, 10: // AuthorizationPolicy
		next.AuthorizationPolicies = mutateList(r, objs.AuthorizationPolicies, orig.AuthorizationPolicies, func(ap *securityv1.AuthorizationPolicy) {
			switch pick(3) {
			case 0:
				ap.Spec.Selector = nil
			case 1:
				ap.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": labelValues[pick(len(labelValues))]}}
			default:
				ap.Namespace = []string{"default", "istio-system", "demo", "ns-1"}[pick(4)]
			}
		})
	case 11: // PeerAuthentication
		next.PeerAuthentications = mutateList(r, objs.PeerAuthentications, orig.PeerAuthentications, func(pa *securityv1.PeerAuthentication) {
			if pick(2) == 0 {
				pa.Spec.Mtls = &securityv1beta1.PeerAuthentication_MutualTLS{Mode: securityv1beta1.PeerAuthentication_MutualTLS_Mode(pick(4))}
			} else if pa.Spec.Selector == nil {
				pa.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": labelValues[pick(len(labelValues))]}}
			} else {
				pa.Spec.Selector = nil
			}
		})
	case 12: // ServiceEntry
		next.ServiceEntries = mutateList(r, objs.ServiceEntries, orig.ServiceEntries, func(se *networkingv1.ServiceEntry) {
			switch pick(3) {
			case 0:
				se.Spec.WorkloadSelector = &networkingv1alpha3.WorkloadSelector{Labels: map[string]string{"app": labelValues[pick(len(labelValues))]}}
			case 1:
				se.Spec.WorkloadSelector = nil
			default:
				if len(se.Spec.Hosts) > 0 {
					se.Spec.Hosts[0] = labelValues[pick(len(labelValues))] + ".example.com"
				}
			}
		})
	case 13: // Gateway
		next.Gateways = mutateList(r, objs.Gateways, orig.Gateways, func(gw *gatewayv1.Gateway) {
			if gw.Labels == nil {
				gw.Labels = map[string]string{}
			}
			if pick(2) == 0 {
				gw.Labels[LabelWaypointFor] = []string{"service", "workload", "all", "none"}[pick(4)]
			} else {
				gw.Status.Addresses = nil
			}
		})
	case 14: // a pod's own waypoint
		next.Pods = clone(objs.Pods)
		if len(next.Pods) > 0 {
			i := pick(len(next.Pods))
			p := next.Pods[i].DeepCopy()
			if p.Labels == nil {
				p.Labels = map[string]string{}
			}
			p.Labels[LabelUseWaypoint] = []string{"waypoint", "none", "missing"}[pick(3)]
			next.Pods[i] = p
		}
	default: // nothing changed: a Source may publish an identical set
	}
	next.Sort()
	return &next
}

// mutateList changes one object of s (a deep copy changed by change),
// removes one, or re-adds one of orig, and returns the new sorted slice.
func mutateList[T interface {
	object
	DeepCopy() T
}](r *rand.Rand, s, orig []T, change func(T)) []T {
	out := clone(s)
	if len(out) == 0 || r.IntN(4) == 0 {
		if len(orig) > 0 {
			out = dedupeByKey(append(out, orig[r.IntN(len(orig))]))
		}
	} else if i := r.IntN(len(out)); r.IntN(4) == 0 {
		out = append(out[:i], out[i+1:]...)
	} else {
		o := out[i].DeepCopy()
		change(o)
		out[i] = o
		out = dedupeByKey(out)
	}
	return out
}

// sameResult compares two Results (protos with proto.Equal).
func sameResult(a, b *Result) bool {
	if a.Addresses.Len() != b.Addresses.Len() || len(a.Authorizations) != len(b.Authorizations) ||
		!reflect.DeepEqual(a.Warnings, b.Warnings) || !reflect.DeepEqual(a.Policies, b.Policies) ||
		!reflect.DeepEqual(a.WaypointPolicies, b.WaypointPolicies) || !reflect.DeepEqual(a.Allocations, b.Allocations) {
		return false
	}
	for k, v := range a.Addresses.All() {
		if w, ok := b.Addresses.Get(k); !ok || !proto.Equal(v, w) {
			return false
		}
	}
	for k, v := range a.Authorizations {
		if !proto.Equal(v, b.Authorizations[k]) {
			return false
		}
	}
	return true
}

func dedupeByKey[T object](s []T) []T {
	seen := map[string]bool{}
	out := s[:0]
	for _, o := range s {
		if !seen[key(o)] {
			seen[key(o)] = true
			out = append(out, o)
		}
	}
	return out
}

// TestIncrementalEqualsFull: after every random change, Update gives
// exactly what a fresh Translate of the same set gives.
func TestIncrementalEqualsFull(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.yaml")
	type input struct {
		name string
		objs *cluster.Objects
	}
	var inputs []input
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		inputs = append(inputs, input{name, loadObjects(t, f)})
	}
	inputs = append(inputs, input{"synth", synth.Build(synth.Spec{Pods: 200, Namespaces: 6, Nodes: 4, PodsPerService: 4, AmbientEvery: 3})})
	for _, in := range inputs {
		t.Run(in.name, func(t *testing.T) {
			cfg := LocalDefaults()
			if f := configFor[in.name]; f != nil {
				f(&cfg)
			}
			al, err := autoalloc.New(autoalloc.Config{})
			if err != nil {
				t.Fatal(err)
			}
			allocs, err := al.Allocate(in.objs.ServiceEntries)
			if err != nil {
				t.Fatal(err)
			}
			tr := NewTranslator(cfg)
			tr.parallelMin = 2 // full translations take the parallel path
			r := rand.New(rand.NewPCG(7, uint64(len(in.name))))
			objs := in.objs
			incremental := 0
			const steps = 120
			for step := 0; step < steps; step++ {
				res, ch := tr.Update(objs, allocs)
				if !ch.Full {
					incremental++
				}
				full := Translate(cfg, objs, allocs)
				if sameResult(res, full) {
					objs = mutate(r, objs, in.objs)
					continue
				}
				if got, want := goldenJSON(t, res), goldenJSON(t, full); !bytes.Equal(got, want) {
					t.Fatalf("step %d (full=%v %s): incremental result differs from a full translation:\n%s\nwant:\n%s", step, ch.Full, ch.Reason, got, want)
				}
				objs = mutate(r, objs, in.objs)
			}
			if incremental < steps/3 {
				t.Errorf("only %d of %d updates were incremental", incremental, steps)
			}
		})
	}
}

// TestPodChangeTouchesOneWorkload: at 50k pods, one pod change translates
// exactly that pod's workload and no Service or EndpointSlice, and pushes
// one resource.
func TestPodChangeTouchesOneWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("50k pods")
	}
	s := synth.Default(50_000)
	objs := synth.Build(s)
	tr := NewTranslator(LocalDefaults())
	res, ch := tr.Update(objs, nil)
	if !ch.Full || ch.Pods != 50_000 || ch.Services != 5_000 {
		t.Fatalf("first update: full=%v pods=%d services=%d", ch.Full, ch.Pods, ch.Services)
	}
	// 50k workloads, 5k Services, and per ServiceEntry a service and a
	// workload (its DNS host).
	addrs := 55_000 + 2*len(objs.ServiceEntries)
	if n := res.Addresses.Len(); n != addrs {
		t.Fatalf("%d addresses, want %d", n, addrs)
	}
	for i, idx := range []int{0, 12_345, 49_999} {
		gen := 2*i + 1 // odd: not ready
		next := synth.WithPod(objs, s, idx, gen)
		res, ch = tr.Update(next, nil)
		if ch.Full {
			t.Fatalf("pod change gave a full translation: %s", ch.Reason)
		}
		if ch.Pods != 1 || ch.Services != 0 || ch.EndpointSlices != 0 {
			t.Errorf("pod change translated %d pods, %d services, %d slices; want 1, 0, 0", ch.Pods, ch.Services, ch.EndpointSlices)
		}
		p := synth.Pod(s, idx, gen)
		uid := "Kubernetes//Pod/" + p.Namespace + "/" + p.Name
		if len(ch.Addresses) != 1 || ch.Addresses[uid] == nil || len(ch.Removed) != 0 {
			t.Errorf("changes: %d addresses (want only %s), removed %v", len(ch.Addresses), uid, ch.Removed)
		}
		if w := ch.Addresses[uid].GetWorkload(); w == nil || len(w.Services) != 1 || w.Status.String() != "UNHEALTHY" {
			t.Errorf("changed workload = %v, want one service and UNHEALTHY (gen 1 is not ready)", w)
		}
		objs = next
	}
	if n := res.Addresses.Len(); n != addrs {
		t.Errorf("%d addresses after changes, want %d", n, addrs)
	}
	// A Service's selector change redoes that Service and the pods it
	// selected or selects, nothing else.
	next := *objs
	next.Services = clone(objs.Services)
	svc := next.Services[0].DeepCopy()
	svc.Spec.Selector = map[string]string{"app": "nothing-has-this"}
	next.Services[0] = svc
	_, ch = tr.Update(&next, nil)
	if ch.Full || ch.Services != 1 || ch.Pods != s.PodsPerService || ch.EndpointSlices != 1 {
		t.Errorf("selector change: full=%v (%s), %d services, %d pods, %d slices; want 1, %d, 1",
			ch.Full, ch.Reason, ch.Services, ch.Pods, ch.EndpointSlices, s.PodsPerService)
	}
}

// TestSelectorPolicyIndexMatchesScan: the namespace-indexed lookup gives
// what policiesFor's scan gives.
func TestSelectorPolicyIndexMatchesScan(t *testing.T) {
	objs := loadObjects(t, "testdata/authz.yaml")
	tr := NewTranslator(LocalDefaults())
	tr.Update(objs, nil)
	for _, p := range objs.Pods {
		got := tr.t.selectorPoliciesFor(p.Namespace, p.Labels)
		want := tr.t.policiesFor(p.Namespace, p.Labels)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("pod %s/%s: indexed %v, scan %v", p.Namespace, p.Name, got, want)
		}
	}
}

// TestGlobalChangeBounded: at the synthetic 50k size, a change of each
// kind translated in the global unit is applied incrementally, matches a
// fresh full translation (and so do the waypoint configs built from it),
// and re-translates only what the change can reach: the pods of one
// namespace (100 of 50k) at most.
func TestGlobalChangeBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("50k pods")
	}
	s := synth.Default(50_000)
	objs := synth.Build(s)
	cfg := LocalDefaults()
	tr := NewTranslator(cfg)
	tr.Update(objs, nil)
	perNs := s.Pods / s.Namespaces
	amb := synth.AmbientNamespaces(s)[1]
	gw := objs.Gateways[slices.IndexFunc(objs.Gateways, func(g *gatewayv1.Gateway) bool { return g.Namespace == synth.NamespaceName(amb) })].DeepCopy()
	gw.Status.Addresses[0].Value = "172.30.0.1"
	for _, c := range []struct {
		kind                string
		next                func(*cluster.Objects) *cluster.Objects
		maxPods, maxSvc     int
		wantPods, wantRoute bool
	}{
		{"namespace", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*corev1.Namespace { return &o.Namespaces }, synth.Namespace(s, amb, 1))
		}, perNs, perNs / s.PodsPerService, true, false},
		{"policy", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*securityv1.AuthorizationPolicy { return &o.AuthorizationPolicies }, synth.Policy(s, 3, 1))
		}, perNs, 0, true, false},
		{"peerauthn", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*securityv1.PeerAuthentication { return &o.PeerAuthentications }, synth.PeerAuthentication(s, synth.PeerAuthnNamespaces(s)[0], 1))
		}, perNs, 0, true, false},
		{"serviceentry", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*networkingv1.ServiceEntry { return &o.ServiceEntries }, synth.ServiceEntry(s, synth.ServiceEntryNamespaces(s)[0], 1))
		}, 0, 0, false, false},
		{"route", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*gatewayv1.HTTPRoute { return &o.HTTPRoutes }, synth.Route(s, amb, 1))
		}, 0, 0, false, true},
		{"gateway", func(o *cluster.Objects) *cluster.Objects {
			return synth.With(o, func(o *cluster.Objects) *[]*gatewayv1.Gateway { return &o.Gateways }, gw)
		}, perNs, perNs / s.PodsPerService, true, false},
	} {
		t.Run(c.kind, func(t *testing.T) {
			next := c.next(objs)
			res, ch := tr.Update(next, nil)
			if ch.Full {
				t.Fatalf("full translation: %s", ch.Reason)
			}
			if ch.Pods > c.maxPods || ch.Services > c.maxSvc || c.wantPods && ch.Pods == 0 || ch.Routes != c.wantRoute {
				t.Errorf("translated %d pods, %d services (routes %v); want at most %d pods (some: %v), %d services, routes %v",
					ch.Pods, ch.Services, ch.Routes, c.maxPods, c.wantPods, c.maxSvc, c.wantRoute)
			}
			if c.wantPods && len(ch.Addresses) == 0 {
				t.Errorf("no address changed")
			}
			full := Translate(cfg, next, nil)
			if !sameResult(res, full) {
				t.Fatalf("incremental result differs from a full translation")
			}
			scan := *full
			scan.bound = nil // every address scanned
			got, gotSt := WaypointConfigs(cfg, next, res)
			want, wantSt := WaypointConfigs(cfg, next, &scan)
			if len(got) != len(want) || !reflect.DeepEqual(gotSt, wantSt) {
				t.Fatalf("waypoint configs: %d vs %d, statuses equal %v", len(got), len(want), reflect.DeepEqual(gotSt, wantSt))
			}
			for k, v := range want {
				if !proto.Equal(got[k], v) {
					t.Errorf("waypoint config %s differs from one built by scanning every address", k)
				}
			}
			objs = next
		})
	}
}

// TestSystemNamespaceNetworkChange: with no configured network, the system
// namespace's network label is every workload's default network, so a
// change of it re-translates everything, and the result equals a full
// translation.
func TestSystemNamespaceNetworkChange(t *testing.T) {
	cfg := LocalDefaults()
	cfg.Network = ""
	objs := synth.Build(synth.Spec{Pods: 40, Namespaces: 4, Nodes: 2, PodsPerService: 4, AmbientEvery: 2})
	withRoot := func(labels map[string]string) *cluster.Objects {
		next := *objs
		next.Namespaces = append(clone(objs.Namespaces), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cfg.RootNamespace, Labels: labels, ResourceVersion: fmt.Sprint(len(labels))}})
		next.Sort()
		return &next
	}
	tr := NewTranslator(cfg)
	tr.Update(withRoot(nil), nil)
	next := withRoot(map[string]string{LabelNetwork: "net-a"})
	res, ch := tr.Update(next, nil)
	if !ch.Full {
		t.Errorf("system namespace network change: incremental (%s), want a full translation", ch.Reason)
	}
	if full := Translate(cfg, next, nil); !sameResult(res, full) {
		t.Fatalf("result differs from a full translation:\n%s\nwant:\n%s", goldenJSON(t, res), goldenJSON(t, full))
	}
	for _, a := range res.Addresses.All() {
		if w := a.GetWorkload(); w != nil && w.Network != "net-a" {
			t.Fatalf("workload %s on network %q, want net-a", w.Uid, w.Network)
		}
	}
}
