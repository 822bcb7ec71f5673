package deploy_test

import (
	"context"
	"os"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

// manifests is what `helm template` renders (deploy/check.sh keeps it current).
const manifests = "manifests/ztunnel-go.yaml"

// systemNamespace is the namespace the manifests are rendered for.
const systemNamespace = "istio-system"

// TestDryRunApply applies every rendered document server-side with
// dryRun=All against a real kube-apiserver, so schema, validation and
// admission errors (a misspelt field, a negative minAvailable) fail here
// rather than at install time. Then it applies them for real and
// checks the RBAC: each component may do what it needs and no more.
func TestDryRunApply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	data, err := os.ReadFile(manifests)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubeapi.DecodeObjects(data)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	for kind, n := range map[string]int{"DaemonSet": 2, "Deployment": 1, "CustomResourceDefinition": 8, "PodDisruptionBudget": 1, "ServiceAccount": 4} {
		if kinds[kind] != n {
			t.Errorf("%d %s in %s, want %d", kinds[kind], kind, manifests, n)
		}
	}

	s := kubeapi.Start(t, kubeapi.Options{})
	// A Namespace in a dry run is not created, so the objects in it would
	// be refused: the chart is installed into an existing namespace.
	if err := s.EnsureNamespace(ctx, systemNamespace, nil); err != nil {
		t.Fatal(err)
	}
	t.Run("DryRun", func(t *testing.T) {
		// One document at a time, so every broken one is reported.
		for _, o := range objs {
			b, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Apply(ctx, b, kubeapi.ApplyOptions{DryRun: true}); err != nil {
				t.Errorf("dry-run apply: %v", err)
			}
		}
	})
	if t.Failed() {
		return
	}

	if err := s.Apply(ctx, data, kubeapi.ApplyOptions{}); err != nil {
		t.Fatalf("apply: %v", err)
	}
	sa := func(name string) string { return "system:serviceaccount:" + systemNamespace + ":" + name }
	tests := []struct {
		user  string
		attrs authorizationv1.ResourceAttributes
		allow bool
	}{
		// Control plane.
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "watch", Resource: "pods"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "watch", Resource: "nodes"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "list", Group: "networking.istio.io", Resource: "serviceentries"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Group: "networking.istio.io", Resource: "serviceentries", Subresource: "status", Namespace: "app"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "update", Group: "networking.istio.io", Resource: "serviceentries", Namespace: "app"}, false},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "watch", Group: "security.istio.io", Resource: "authorizationpolicies"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Group: "security.istio.io", Resource: "authorizationpolicies", Subresource: "status", Namespace: "app"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Group: "security.istio.io", Resource: "authorizationpolicies", Namespace: "app"}, false},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Group: "networking.istio.io", Resource: "destinationrules", Subresource: "status", Namespace: "app"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "watch", Group: "telemetry.istio.io", Resource: "telemetries"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Group: "telemetry.istio.io", Resource: "telemetries", Subresource: "status", Namespace: "app"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "watch", Group: "gateway.networking.k8s.io", Resource: "gateways"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "ztunnel-cp", Namespace: systemNamespace}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Name: "other", Namespace: systemNamespace}, false},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "update", Resource: "configmaps", Name: "istio-ca-root-cert", Namespace: systemNamespace}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "get", Resource: "configmaps", Name: "istio-ca-root-cert", Namespace: systemNamespace}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "create", Resource: "configmaps", Namespace: systemNamespace}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "update", Resource: "configmaps", Name: "other", Namespace: systemNamespace}, false},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "list", Resource: "configmaps", Namespace: systemNamespace}, false},
		// The waypoint controller writes the root ConfigMap into waypoint
		// namespaces (by name; create cannot be limited by name), and
		// deploys waypoints; nothing else there.
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "create", Resource: "configmaps", Namespace: "app"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Resource: "configmaps", Name: "istio-ca-root-cert", Namespace: "app"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Resource: "configmaps", Name: "app-config", Namespace: "app"}, false},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Group: "apps", Resource: "deployments", Namespace: "app"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "delete", Group: "apps", Resource: "deployments", Namespace: "app"}, false},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Group: "gateway.networking.k8s.io", Resource: "gateways", Subresource: "status", Namespace: "app"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Group: "gateway.networking.k8s.io", Resource: "gateways", Namespace: "app"}, false},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods", Namespace: "app"}, true},
		// Secrets: read (as istiod reads them) for DestinationRule
		// tls.credentialName; never written.
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "list", Resource: "secrets", Namespace: "app"}, true},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Resource: "secrets", Namespace: "app"}, false},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "create", Resource: "secrets", Namespace: systemNamespace}, false},
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "patch", Resource: "pods", Namespace: "app"}, false},
		// Remote secrets (multicluster): read in the system namespace.
		{sa("ztunnel-cp"), authorizationv1.ResourceAttributes{Verb: "watch", Resource: "secrets", Namespace: systemNamespace}, true},
		// The account other primaries read this cluster as: read only,
		// the kinds the workload merge needs.
		{sa("istio-reader-service-account"), authorizationv1.ResourceAttributes{Verb: "watch", Resource: "pods"}, true},
		{sa("istio-reader-service-account"), authorizationv1.ResourceAttributes{Verb: "list", Resource: "nodes"}, true},
		{sa("istio-reader-service-account"), authorizationv1.ResourceAttributes{Verb: "watch", Group: "discovery.k8s.io", Resource: "endpointslices"}, true},
		{sa("istio-reader-service-account"), authorizationv1.ResourceAttributes{Verb: "list", Group: "gateway.networking.k8s.io", Resource: "gateways"}, true},
		{sa("istio-reader-service-account"), authorizationv1.ResourceAttributes{Verb: "list", Resource: "secrets", Namespace: "app"}, false},
		{sa("istio-reader-service-account"), authorizationv1.ResourceAttributes{Verb: "patch", Resource: "pods", Namespace: "app"}, false},
		{sa("istio-reader-service-account"), authorizationv1.ResourceAttributes{Verb: "list", Group: "security.istio.io", Resource: "authorizationpolicies"}, false},
		// Node agent.
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "watch", Resource: "pods"}, true},
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "watch", Resource: "namespaces"}, true},
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "list", Resource: "nodes"}, false},
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "patch", Resource: "pods", Subresource: "status", Namespace: "app"}, true},
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "patch", Resource: "pods", Namespace: "app"}, false},
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: "app"}, false},
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"}, false},
		// Its own DaemonSet only (upgrade vs uninstall on exit).
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "watch", Group: "apps", Resource: "daemonsets", Name: "ztunnel-cni", Namespace: systemNamespace}, true},
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "get", Group: "apps", Resource: "daemonsets", Name: "ztunnel-cni", Namespace: systemNamespace}, true},
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "get", Group: "apps", Resource: "daemonsets", Name: "ztunnel", Namespace: systemNamespace}, false},
		{sa("ztunnel-cni"), authorizationv1.ResourceAttributes{Verb: "delete", Group: "apps", Resource: "daemonsets", Name: "ztunnel-cni", Namespace: systemNamespace}, false},
		// Node proxy: nothing.
		{sa("ztunnel"), authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods"}, false},
		{sa("ztunnel"), authorizationv1.ResourceAttributes{Verb: "get", Resource: "configmaps", Namespace: systemNamespace}, false},
		{sa("ztunnel"), authorizationv1.ResourceAttributes{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"}, false},
	}
	c := s.Client()
	for _, tc := range tests {
		a := tc.attrs
		review, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               tc.user,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + systemNamespace, "system:authenticated"},
				ResourceAttributes: &a,
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != tc.allow {
			t.Errorf("%s %s %s/%s %s/%s name=%q: allowed=%v, want %v", tc.user, a.Verb, a.Group, a.Resource,
				a.Subresource, a.Namespace, a.Name, review.Status.Allowed, tc.allow)
		}
	}
}
