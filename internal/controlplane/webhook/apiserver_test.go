package webhook

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

const webhookName = "validation.ztunnel-go.io"

var apGVR = schema.GroupVersionResource{Group: "security.istio.io", Version: "v1", Resource: "authorizationpolicies"}

// TestOnAPIServer: registered with a real kube-apiserver (failurePolicy
// Fail, the kinds the control plane reads), the webhook makes an apply of
// a policy with a value that cannot be enforced fail, naming the field;
// a valid policy and a ServiceEntry are admitted. The configuration is
// created without a caBundle: the refusal only comes once Server has set it
// (the API server verifies the webhook against it).
func TestOnAPIServer(t *testing.T) {
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := api.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := caserver.ServingCertificate(c, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()

	// The configuration as the chart installs it: no caBundle; the server
	// sets it.
	url := "https://" + addr + Path
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigurationName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         webhookName,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"security.istio.io", "networking.istio.io"}, APIVersions: []string{"*"},
					Resources: []string{"authorizationpolicies", "peerauthentications", "serviceentries", "workloadentries"},
				},
			}},
			FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if _, err := api.Client().AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ws, err := NewServer(ServerConfig{Addr: addr, Cert: cert, CABundle: c.RootPEM(), Client: api.Client()})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ws.Run(sctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	const bad = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: bad, namespace: default}
spec:
  action: DENY
  rules: [{to: [{operation: {ports: ["22a"]}}]}]
`
	// The API server picks the configuration up within a moment: until it
	// does, the bad policy is admitted; remove it and try again.
	var refusal error
	for refusal == nil {
		refusal = api.Apply(ctx, []byte(bad), kubeapi.ApplyOptions{})
		if refusal == nil {
			if err := api.Dynamic().Resource(apGVR).Namespace("default").Delete(ctx, "bad", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-ctx.Done():
				t.Fatal("the webhook never refused the bad policy")
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	for _, want := range []string{`admission webhook "` + webhookName + `" denied the request`,
		`AuthorizationPolicy default/bad: spec.rules[0].to[0].operation.ports[0]: "22a" is not a port number`} {
		if !strings.Contains(refusal.Error(), want) {
			t.Errorf("refusal %q does not contain %q", refusal, want)
		}
	}
	const good = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: good, namespace: default}
spec:
  action: DENY
  rules: [{to: [{operation: {ports: ["22"]}}]}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: default}
spec: {hosts: [api.example.com], ports: [{number: 443, name: tls, protocol: TLS}], resolution: DNS}
`
	if err := api.Apply(ctx, []byte(good), kubeapi.ApplyOptions{}); err != nil {
		t.Fatalf("valid objects refused: %v", err)
	}
}
