package kubeapi

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EnsureNamespace creates namespace ns with labels unless it exists (an
// existing one is left as it is).
func (s *Server) EnsureNamespace(ctx context.Context, ns string, labels map[string]string) error {
	_, err := s.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubeapi: create namespace %s: %w", ns, err)
	}
	return nil
}

// EnsureServiceAccount creates ServiceAccount ns/sa, and its namespace,
// unless they exist. No controller manager runs, so nothing else does.
func (s *Server) EnsureServiceAccount(ctx context.Context, ns, sa string) error {
	if err := s.EnsureNamespace(ctx, ns, nil); err != nil {
		return err
	}
	_, err := s.Client().CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubeapi: create serviceaccount %s/%s: %w", ns, sa, err)
	}
	return nil
}

// CreateServiceAccountToken returns a token for ServiceAccount ns/sa (created
// with its namespace when missing) from the TokenRequest API, valid for one
// hour, with the given audience (empty: DefaultAudience).
func (s *Server) CreateServiceAccountToken(ctx context.Context, ns, sa, audience string) (string, error) {
	return s.requestToken(ctx, ns, sa, audience, nil)
}

// CreatePodToken returns the token the kubelet would project into pod: its
// ServiceAccount's (created when missing; empty spec.serviceAccountName means
// "default"), bound to the pod, so a TokenReview reports the pod's name and
// UID (and node, when spec.nodeName names an existing Node) in the user's
// extra fields. The pod must exist (it needs its UID).
func (s *Server) CreatePodToken(ctx context.Context, pod *corev1.Pod, audience string) (string, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	return s.requestToken(ctx, pod.Namespace, sa, audience, &authenticationv1.BoundObjectReference{
		Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID,
	})
}

func (s *Server) requestToken(ctx context.Context, ns, sa, audience string, bound *authenticationv1.BoundObjectReference) (string, error) {
	if err := s.EnsureServiceAccount(ctx, ns, sa); err != nil {
		return "", err
	}
	if audience == "" {
		audience = DefaultAudience
	}
	exp := int64(3600)
	tr, err := s.Client().CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         []string{audience},
			ExpirationSeconds: &exp,
			BoundObjectRef:    bound,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("kubeapi: token for %s/%s (audience %s): %w", ns, sa, audience, err)
	}
	return tr.Status.Token, nil
}
