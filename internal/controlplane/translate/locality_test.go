package translate

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

func localityNode(name, rv string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: rv, Labels: labels}}
}

func localityPod(name, node, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1", Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

func workloadLocality(t *testing.T, res *Result, pod string) *workloadapi.Locality {
	t.Helper()
	a, ok := res.Addresses.Get("Kubernetes//Pod/app/" + pod)
	if !ok {
		t.Fatalf("no workload for pod %s", pod)
	}
	return a.GetWorkload().GetLocality()
}

// TestPodLocality: istiod's order. The pod's istio-locality label wins;
// else its Node's topology labels (even none: then no locality, whatever
// the pod's own labels claim); the pod's topology labels only when its Node
// is not in the set (local mode).
func TestPodLocality(t *testing.T) {
	zoneLabels := func(r, z, s string) map[string]string {
		m := map[string]string{}
		for k, v := range map[string]string{LabelRegion: r, LabelZone: z, LabelSubzone: s} {
			if v != "" {
				m[k] = v
			}
		}
		return m
	}
	loc := func(r, z, s string) *workloadapi.Locality {
		return &workloadapi.Locality{Region: r, Zone: z, Subzone: s}
	}
	tests := []struct {
		name      string
		node      *corev1.Node // nil: not in the set
		podLabels map[string]string
		want      *workloadapi.Locality
	}{
		{"node labels", localityNode("n1", "1", zoneLabels("r1", "z1", "s1")), nil, loc("r1", "z1", "s1")},
		{"node labels win over the pod's", localityNode("n1", "1", zoneLabels("r1", "z1", "")), zoneLabels("r9", "z9", ""), loc("r1", "z1", "")},
		{"node without topology labels", localityNode("n1", "1", nil), zoneLabels("r9", "z9", ""), nil},
		{"istio-locality overrides the node", localityNode("n1", "1", zoneLabels("r1", "z1", "")),
			map[string]string{LabelLocality: "r2.z2.s2"}, loc("r2", "z2", "s2")},
		{"istio-locality region only", nil, map[string]string{LabelLocality: "r3"}, loc("r3", "", "")},
		{"node not in the set: pod labels", nil, zoneLabels("r4", "z4", ""), loc("r4", "z4", "")},
		{"nothing", nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := &cluster.Objects{Pods: []*corev1.Pod{localityPod("p", "n1", "10.0.0.1", tt.podLabels)}}
			if tt.node != nil {
				objs.Nodes = []*corev1.Node{tt.node}
			}
			got := workloadLocality(t, Translate(LocalDefaults(), objs, nil), "p")
			if !proto.Equal(got, tt.want) {
				t.Fatalf("locality = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestNodeChangeRetranslatesItsPods: a Node relabel redoes the pods on that
// node only; a Node update that leaves its topology labels alone (a status
// update) redoes nothing; removing the Node falls back as Translate does.
// Every step equals a full translation.
func TestNodeChangeRetranslatesItsPods(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 6 {
		pods = append(pods, localityPod(fmt.Sprintf("p%d", i), fmt.Sprintf("n%d", i%3), fmt.Sprintf("10.0.0.%d", i+1), nil))
	}
	nodes := func(rv, zone0 string, extra map[string]string) []*corev1.Node {
		n0 := map[string]string{LabelZone: zone0}
		for k, v := range extra {
			n0[k] = v
		}
		return []*corev1.Node{
			localityNode("n0", rv, n0),
			localityNode("n1", "1", map[string]string{LabelZone: "zb"}),
			localityNode("n2", "1", map[string]string{LabelZone: "zc"}),
		}
	}
	tr := NewTranslator(LocalDefaults())
	step := func(objs *cluster.Objects) *Changes {
		t.Helper()
		res, ch := tr.Update(objs, nil)
		full := Translate(LocalDefaults(), objs, nil)
		for k, v := range full.Addresses.All() {
			if got, ok := res.Addresses.Get(k); !ok || !proto.Equal(got, v) {
				t.Fatalf("incremental %s = %v, full translation %v", k, got, v)
			}
		}
		if res.Addresses.Len() != full.Addresses.Len() {
			t.Fatalf("incremental has %d resources, full %d", res.Addresses.Len(), full.Addresses.Len())
		}
		return ch
	}
	step(&cluster.Objects{Pods: pods, Nodes: nodes("1", "za", nil)})
	if got := workloadLocality(t, tr.Result(), "p3").GetZone(); got != "za" {
		t.Fatalf("p3 (on n0) zone %q, want za", got)
	}

	ch := step(&cluster.Objects{Pods: pods, Nodes: nodes("2", "za2", nil)})
	if ch.Full || ch.Nodes != 1 || ch.Pods != 2 {
		t.Fatalf("relabel of n0: full=%v (%s), nodes=%d, pods=%d; want the 2 pods of n0 only", ch.Full, ch.Reason, ch.Nodes, ch.Pods)
	}
	if got := workloadLocality(t, tr.Result(), "p0").GetZone(); got != "za2" {
		t.Fatalf("p0 zone %q after the relabel, want za2", got)
	}

	ch = step(&cluster.Objects{Pods: pods, Nodes: nodes("3", "za2", map[string]string{"kubernetes.io/hostname": "n0"})})
	if ch.Full || ch.Nodes != 0 || ch.Pods != 0 {
		t.Fatalf("n0 updated without a locality change: full=%v, nodes=%d, pods=%d; want nothing redone", ch.Full, ch.Nodes, ch.Pods)
	}

	ch = step(&cluster.Objects{Pods: pods, Nodes: nodes("3", "za2", map[string]string{"kubernetes.io/hostname": "n0"})[1:]})
	if ch.Full || ch.Nodes != 1 || ch.Pods != 2 {
		t.Fatalf("n0 removed: full=%v, nodes=%d, pods=%d; want the 2 pods of n0", ch.Full, ch.Nodes, ch.Pods)
	}
	if got := workloadLocality(t, tr.Result(), "p0"); got != nil {
		t.Fatalf("p0 locality %v after its node left (no pod labels), want none", got)
	}
}
