package kubestatus

import (
	"context"
	"strings"
	"testing"
	"time"

	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// TestIstioStatusOnAPIServer runs the status writer as the control plane
// does (kube source → translate → IstioWriter, writing only while holding
// the Lease) against a real API server with the chart's CRDs: an
// AuthorizationPolicy with an unparseable ipBlocks value gets
// Reconciled=False naming the field and an IST0106 message, a good one
// gets Reconciled=True with no messages, a forged clean status is
// corrected, another writer's condition survives, fixing the bad one clears its message, and a settled status is
// not written again.
func TestIstioStatusOnAPIServer(t *testing.T) {
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := api.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	if err := api.EnsureNamespace(ctx, "app", nil); err != nil {
		t.Fatal(err)
	}
	clients, err := kube.NewClients(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	if err := api.EnsureNamespace(ctx, DefaultLeaseNamespace, nil); err != nil {
		t.Fatal(err)
	}
	aps := clients.Istio.SecurityV1().AuthorizationPolicies("app")
	mk := func(name, cidr string) *securityv1.AuthorizationPolicy {
		ap := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name}}
		ap.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": name}}
		ap.Spec.Rules = []*securityv1beta1.Rule{{From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{IpBlocks: []string{cidr}}}}}}
		got, err := aps.Create(ctx, ap, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	bad := mk("bad", "10.1.0.0/33")
	mk("good", "10.1.0.0/16")
	// Another writer's condition on the good policy must survive ours.
	if _, err := aps.Patch(ctx, "good", "application/merge-patch+json",
		[]byte(`{"status":{"conditions":[{"type":"ZtunnelAccepted","status":"True","reason":"Accepted"}]}}`),
		metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}

	// A tenant forges a clean status on the bad policy before we run: it
	// must not hide the problem.
	if _, err := aps.Patch(ctx, "bad", "application/merge-patch+json",
		[]byte(`{"status":{"conditions":[{"type":"Reconciled","status":"True","reason":"Accepted","observedGeneration":1}]}}`),
		metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}

	src, err := kube.New(kube.Config{Clients: clients})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := New(Config{Istio: clients.Istio, Kube: clients.Kube, Source: src, Identity: "test",
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	iw, err := NewIstio(IstioConfig{Istio: clients.Istio, Leading: lease.Leading, QPS: 50})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = src.Run(runCtx) }()
	go func() { _ = lease.Run(runCtx) }()
	go func() { _ = iw.Run(runCtx) }()
	go func() {
		for runCtx.Err() == nil {
			objs, changed := src.Current()
			if objs != nil {
				iw.Update(objs, translate.Translate(translate.Config{}, objs, nil).Policies)
			}
			select {
			case <-runCtx.Done():
			case <-changed:
			}
		}
	}()

	// waitFor polls name until ok accepts it and returns it.
	waitFor := func(name, what string, ok func(*securityv1.AuthorizationPolicy) bool) *securityv1.AuthorizationPolicy {
		t.Helper()
		var last *securityv1.AuthorizationPolicy
		for {
			ap, err := aps.Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				last = ap
				if ok(ap) {
					return ap
				}
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: %s never happened; status %v", name, what, last.Status.String())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	reconciled := func(ap *securityv1.AuthorizationPolicy) (status, reason, msg string, gen int64) {
		for _, c := range ap.Status.GetConditions() {
			if c.GetType() == ConditionReconciled {
				return c.GetStatus(), c.GetReason(), c.GetMessage(), c.GetObservedGeneration()
			}
		}
		return "", "", "", 0
	}
	codes := func(ap *securityv1.AuthorizationPolicy) []string {
		var out []string
		for _, m := range ap.Status.GetValidationMessages() {
			out = append(out, m.GetType().GetCode()+"/"+m.GetLevel().String())
		}
		return out
	}

	got := waitFor("bad", "Reconciled=False", func(ap *securityv1.AuthorizationPolicy) bool { s, _, _, _ := reconciled(ap); return s == "False" })
	_, reason, msg, gen := reconciled(got)
	if reason != ConditionReasonPartiallyInvalid || gen != bad.Generation ||
		!strings.Contains(msg, "spec.rules[0].from[0].source.ipBlocks[0]") || !strings.Contains(msg, "10.1.0.0/33") {
		t.Fatalf("bad policy: reason %q generation %d message %q", reason, gen, msg)
	}
	if c := codes(got); len(c) != 2 || c[0] != "IST0106/ERROR" || c[1] != "ZTG0001/WARNING" {
		t.Fatalf("bad policy validationMessages %v", c)
	}
	t.Logf("bad policy: %s: %s", reason, msg)

	good := waitFor("good", "Reconciled=True", func(ap *securityv1.AuthorizationPolicy) bool { s, _, _, _ := reconciled(ap); return s == "True" })
	if _, reason, _, _ := reconciled(good); reason != ConditionReasonAccepted || len(codes(good)) != 0 {
		t.Fatalf("good policy: reason %q messages %v", reason, codes(good))
	}
	if cs := good.Status.GetConditions(); len(cs) != 2 || cs[0].GetType() != "ZtunnelAccepted" {
		t.Fatalf("another writer's condition lost: %v", good.Status.String())
	}

	// Fix the bad policy: the message goes, the new generation is recorded.
	fixed := got.DeepCopy()
	fixed.Spec.Rules[0].From[0].Source.IpBlocks = []string{"10.1.0.0/16"}
	fixed, err = aps.Update(ctx, fixed, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got = waitFor("bad", "Reconciled=True after the fix", func(ap *securityv1.AuthorizationPolicy) bool {
		s, _, _, g := reconciled(ap)
		return s == "True" && g == fixed.Generation
	})
	if len(codes(got)) != 0 {
		t.Fatalf("fixed policy keeps validationMessages %v", codes(got))
	}

	// Settled: no write for an unchanged status, across polls and an
	// unrelated change that retranslates everything.
	rv := got.ResourceVersion
	mk("other", "10.2.0.0/16")
	waitFor("other", "Reconciled=True", func(ap *securityv1.AuthorizationPolicy) bool { s, _, _, _ := reconciled(ap); return s == "True" })
	time.Sleep(leaderPoll + 500*time.Millisecond)
	if now, err := aps.Get(ctx, "bad", metav1.GetOptions{}); err != nil || now.ResourceVersion != rv {
		t.Fatalf("unchanged status written again: resourceVersion %s → %s (%v)", rv, now.ResourceVersion, err)
	}
}
