package translate

import (
	"net/netip"
	"strings"
	"testing"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

func ownPod(ns, name, ip string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), ResourceVersion: "1"},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

func seStatus(r *Result, name string) *PolicyStatus {
	for i := range r.Policies {
		if r.Policies[i].Kind == "ServiceEntry" && r.Policies[i].Name == name {
			return &r.Policies[i]
		}
	}
	return nil
}

// TestServiceEntryClusterIPClaim: a ServiceEntry of namespace evil listing
// victim's ClusterIP loses it whatever its name and age, and every client
// namespace (victim, evil, a third) resolves that VIP to the victim's
// Service on the node; the refusal is in evil's status.
func TestServiceEntryClusterIPClaim(t *testing.T) {
	victim := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "web", ResourceVersion: "1",
			CreationTimestamp: metav1.Unix(2000, 0)},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
	// Older than the Service, and a namespace that sorts first.
	claim := testSE("aaa", "claim", 1000, "steal.example", "10.96.0.10", "192.0.2.7")
	objs := &cluster.Objects{Services: []*corev1.Service{victim}, ServiceEntries: []*networkingv1.ServiceEntry{claim}}
	objs.Sort()
	res := Translate(LocalDefaults(), objs, nil)
	st := seStatus(res, "aaa/claim")
	if st == nil || len(st.Invalid) != 1 || !strings.Contains(st.Invalid[0], "10.96.0.10 is the address of Service victim/web") {
		t.Fatalf("aaa/claim status %+v: want spec.addresses[0] refused as victim/web's", st)
	}
	snap := nodeState(t, objs)
	for _, ns := range []string{"victim", "aaa", "third", ""} {
		if s := snap.ServiceByVIP("", netip.MustParseAddr("10.96.0.10"), ns); keyOf(s) != "victim/web.victim.svc.cluster.local" {
			t.Errorf("client namespace %q: 10.96.0.10 is %s, want the victim's Service", ns, keyOf(s))
		}
	}
	// The rest of the entry still works.
	if s := snap.ServiceByVIP("", netip.MustParseAddr("192.0.2.7"), "third"); keyOf(s) != "aaa/steal.example" {
		t.Errorf("192.0.2.7 is %s, want aaa/steal.example", keyOf(s))
	}
}

// TestServiceEntryOwnershipFollowsPods: a pod appearing at an address a
// ServiceEntry of another namespace lists takes it from the entry on an
// incremental Update too (and gives it back when it goes), as a full
// translation of the same set does.
func TestServiceEntryOwnershipFollowsPods(t *testing.T) {
	se := testSE("evil", "grab", 1000, "grab.example", "10.244.0.0/24", "10.244.1.9")
	base := &cluster.Objects{ServiceEntries: []*networkingv1.ServiceEntry{se}}
	withPod := &cluster.Objects{ServiceEntries: base.ServiceEntries,
		Pods: []*corev1.Pod{ownPod("victim", "web-0", "10.244.0.5"), ownPod("victim", "web-1", "10.244.1.9")}}
	tr := NewTranslator(LocalDefaults())
	for i, objs := range []*cluster.Objects{base, withPod, base} {
		objs.Sort()
		got, _ := tr.Update(objs, nil)
		want := Translate(LocalDefaults(), objs, nil)
		if !sameResult(got, want) {
			t.Fatalf("step %d: incremental result differs from a full translation", i)
		}
		st := seStatus(got, "evil/grab")
		if (i == 1) != (st != nil && len(st.Invalid) == 2) {
			t.Errorf("step %d: evil/grab status %+v", i, st)
		}
	}
}
