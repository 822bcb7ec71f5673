package kube

import (
	"context"
	"testing"
	"time"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// waitFor waits (bounded) for a published set satisfying pred.
func waitFor(t *testing.T, s *Source, what string, pred func(*cluster.Objects) bool) *cluster.Objects {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		objs, ch := s.Current()
		if objs != nil && pred(objs) {
			return objs
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func podNames(o *cluster.Objects) []string {
	var out []string
	for _, p := range o.Pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	return out
}

// startAPI starts a real API server with Istio's CRDs and an ambient
// namespace "app", and returns it, clients for it and a context that ends
// after 60 s (or with the test).
func startAPI(t *testing.T) (*kubeapi.Server, *Clients, context.Context) {
	t.Helper()
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if err := api.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	clients, err := NewClients(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	if err := api.EnsureNamespace(ctx, "app", map[string]string{"istio.io/dataplane-mode": "ambient"}); err != nil {
		t.Fatal(err)
	}
	return api, clients, ctx
}

// TestSourceOnAPIServer: the source publishes nothing before its informers
// sync, then every kind it watches (Istio CRDs included), only its node's
// pods with NodeName, follows changes, and keeps serving and resyncs across
// an API server restart.
func TestSourceOnAPIServer(t *testing.T) {
	api, clients, ctx := startAPI(t)
	kc := clients.Kube
	mkPod := func(name, node string) {
		t.Helper()
		_, err := kc.CoreV1().Pods("app").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	mkPod("a1", "n1")
	mkPod("b1", "n2")

	all, err := New(Config{Clients: clients})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := New(Config{Clients: clients, Kinds: AgentKinds(), NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if objs, _ := all.Current(); objs != nil {
		t.Fatal("published before Run")
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	for _, s := range []*Source{all, agent} {
		go func() {
			if err := s.Run(runCtx); err != nil {
				t.Errorf("Run: %v", err)
			}
			done <- struct{}{}
		}()
	}
	t.Cleanup(func() { stop(); <-done; <-done })

	t.Logf("%s: sources running", time.Now().Format("15:04:05.000"))
	objs := waitFor(t, all, "both pods", func(o *cluster.Objects) bool { return len(o.Pods) == 2 })
	if objs.Namespace("app") == nil || objs.Namespace("app").Labels["istio.io/dataplane-mode"] != "ambient" {
		t.Fatalf("namespace app missing or unlabelled: %v", objs.Namespaces)
	}
	aobjs := waitFor(t, agent, "the agent's view", func(o *cluster.Objects) bool { return len(o.Pods) > 0 })
	if got := podNames(aobjs); len(got) != 1 || got[0] != "app/a1" {
		t.Fatalf("agent source pods = %v, want only app/a1 (node n1)", got)
	}
	if len(aobjs.Services) != 0 || len(aobjs.ServiceEntries) != 0 {
		t.Fatal("agent source has kinds it does not watch")
	}

	se := &networkingv1.ServiceEntry{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "ext"},
		Spec:       networkingv1alpha3.ServiceEntry{Hosts: []string{"x.example.com"}, Resolution: networkingv1alpha3.ServiceEntry_DNS},
	}
	if _, err := clients.Istio.NetworkingV1().ServiceEntries("app").Create(ctx, se, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, all, "the ServiceEntry", func(o *cluster.Objects) bool {
		return len(o.ServiceEntries) == 1 && o.ServiceEntries[0].Spec.Hosts[0] == "x.example.com"
	})

	t.Logf("%s: stopping the API server", time.Now().Format("15:04:05.000"))
	api.Stop()
	before, _ := agent.Current()
	time.Sleep(300 * time.Millisecond)
	if after, _ := agent.Current(); after != before || after == nil {
		t.Fatal("the last good set was dropped while the API server is down")
	}
	if err := api.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: API server back", time.Now().Format("15:04:05.000"))
	mkPod("a2", "n1")
	waitFor(t, agent, "a pod created after the restart", func(o *cluster.Objects) bool { return len(o.Pods) == 2 })
	t.Logf("%s: a2 seen", time.Now().Format("15:04:05.000"))
	// No kubelet confirms a graceful deletion: delete at once.
	if err := kc.CoreV1().Pods("app").Delete(ctx, "a1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, agent, "the deletion", func(o *cluster.Objects) bool {
		return len(o.Pods) == 1 && o.Pods[0].Name == "a2"
	})
}
