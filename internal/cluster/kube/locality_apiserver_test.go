package kube

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// TestFailClosedLocalityFromNode: on a real API server, Kubernetes puts the
// topology labels on the Node, not the pod; the control plane's source
// reads Nodes and its translation gives the pod's workload its node's
// locality, and follows a relabel of the Node. (Issue 12 item 12; on
// 325f4ba Nodes were not read and the workload had no locality.)
func TestFailClosedLocalityFromNode(t *testing.T) {
	_, clients, ctx := startAPI(t)
	kc := clients.Kube
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{
		"topology.kubernetes.io/region": "eu-west1", "topology.kubernetes.io/zone": "eu-west1-b",
		"topology.istio.io/subzone": "rack7",
	}}}
	node, err := kc.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := kc.CoreV1().Pods("app").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web"},
		Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.5", PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := kc.CoreV1().Pods("app").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	src, err := New(Config{Clients: clients})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		if err := src.Run(runCtx); err != nil {
			t.Errorf("Run: %v", err)
		}
		close(done)
	}()
	t.Cleanup(func() { stop(); <-done })

	localityOf := func(o *cluster.Objects) *workloadapi.Locality {
		res := translate.Translate(translate.LocalDefaults(), o, nil)
		a, ok := res.Addresses.Get("Kubernetes//Pod/app/web")
		if !ok {
			return nil
		}
		return a.GetWorkload().GetLocality()
	}
	var last *workloadapi.Locality
	waitFor(t, src, "the workload in the node's locality", func(o *cluster.Objects) bool {
		last = localityOf(o)
		return last.GetRegion() == "eu-west1" && last.GetZone() == "eu-west1-b" && last.GetSubzone() == "rack7"
	})

	// The node moves zone (a relabel): the workload follows.
	node.Labels["topology.kubernetes.io/zone"] = "eu-west1-c"
	if _, err := kc.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, src, "the workload in the node's new zone", func(o *cluster.Objects) bool {
		last = localityOf(o)
		return last.GetZone() == "eu-west1-c"
	})
	if last.GetRegion() != "eu-west1" {
		t.Errorf("locality after the relabel = %v", last)
	}
}
