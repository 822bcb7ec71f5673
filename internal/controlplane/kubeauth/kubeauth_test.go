package kubeauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
)

func TestParseAccounts(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: "", want: nil},
		{in: "istio-system/ztunnel", want: []string{"istio-system/ztunnel"}},
		{in: " a/b , ,c/d", want: []string{"a/b", "c/d"}},
		{in: "ztunnel", wantErr: true},
		{in: "a/b/c", wantErr: true},
		{in: "/b", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseAccounts(tt.in)
		if (err != nil) != tt.wantErr || (!tt.wantErr && !equal(got, tt.want)) {
			t.Errorf("ParseAccounts(%q) = %v, %v; want %v (err %v)", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestServiceAccountOf(t *testing.T) {
	tests := map[string]string{
		"system:serviceaccount:istio-system:ztunnel": "istio-system/ztunnel",
		"system:serviceaccount:ns:":                  "",
		"system:serviceaccount:ns":                   "",
		"system:serviceaccount:ns:a:b":               "",
		"admin":                                      "",
		"system:node:n1":                             "",
	}
	for in, want := range tests {
		got, ok := ServiceAccountOf(in)
		if got != want || ok != (want != "") {
			t.Errorf("ServiceAccountOf(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func newAuth(t *testing.T) *Authenticator {
	t.Helper()
	// Nothing listens there: tests that reach the API fail loudly.
	a, err := New(Config{Client: kubernetes.NewForConfigOrDie(&rest.Config{Host: "https://127.0.0.1:1"})})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestCallerFor covers the mappings that need no API call.
func TestCallerFor(t *testing.T) {
	a := newAuth(t)
	tests := []struct {
		name    string
		user    authenticationv1.UserInfo
		want    caserver.Caller
		wantErr bool
	}{
		{name: "workload", user: authenticationv1.UserInfo{Username: "system:serviceaccount:app:web"}, want: caserver.Caller{ServiceAccount: "app/web"}},
		{name: "workload with node extra is not a node proxy",
			user: authenticationv1.UserInfo{Username: "system:serviceaccount:app:web", Extra: map[string]authenticationv1.ExtraValue{ExtraNodeName: {"n1"}}},
			want: caserver.Caller{ServiceAccount: "app/web"}},
		{name: "node proxy from node-name extra",
			user: authenticationv1.UserInfo{Username: "system:serviceaccount:istio-system:ztunnel", Extra: map[string]authenticationv1.ExtraValue{
				ExtraNodeName: {"n1"}, ExtraPodName: {"ztunnel-x"}}},
			want: caserver.Caller{ServiceAccount: "istio-system/ztunnel", Node: "n1"}},
		{name: "unbound node account token is a plain caller",
			user: authenticationv1.UserInfo{Username: "system:serviceaccount:istio-system:ztunnel"},
			want: caserver.Caller{ServiceAccount: "istio-system/ztunnel"}},
		{name: "not a service account", user: authenticationv1.UserInfo{Username: "admin"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := a.callerFor(context.Background(), tt.user)
			if tt.wantErr {
				if !errors.Is(err, caserver.ErrUnauthenticated) {
					t.Fatalf("err = %v, want ErrUnauthenticated", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestBearerAndCache(t *testing.T) {
	a := newAuth(t)
	for _, md := range []metadata.MD{nil, metadata.Pairs("authorization", "Basic x"), metadata.Pairs("authorization", "Bearer ")} {
		if _, err := a.Authenticate(metadata.NewIncomingContext(context.Background(), md)); !errors.Is(err, caserver.ErrUnauthenticated) {
			t.Fatalf("metadata %v: err = %v", md, err)
		}
	}
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer tok"))
	want := caserver.Caller{Node: "n1", ServiceAccount: "istio-system/ztunnel"}
	a.store(sha256Of("tok"), want)
	if got, err := a.Authenticate(ctx); err != nil || got != want {
		t.Fatalf("cached: %+v, %v", got, err)
	}
	now = now.Add(DefaultCacheTTL)
	// Expired: the review goes to the (unreachable) API server and fails.
	if _, err := a.Authenticate(ctx); !errors.Is(err, caserver.ErrUnauthenticated) {
		t.Fatalf("expired entry: err = %v", err)
	}
}

func TestRunsOn(t *testing.T) {
	pod := func(node, sa string, phase corev1.PodPhase) corev1.Pod {
		var p corev1.Pod
		p.Spec.NodeName, p.Spec.ServiceAccountName, p.Status.Phase = node, sa, phase
		return p
	}
	pods := []corev1.Pod{pod("n1", "", corev1.PodRunning), pod("n1", "web", corev1.PodSucceeded), pod("n2", "web", corev1.PodRunning)}
	tests := []struct {
		node, sa string
		want     bool
	}{
		{"n1", "default", true},
		{"n1", "web", false}, // finished
		{"n2", "web", true},
		{"n2", "default", false},
		{"n3", "web", false},
	}
	for _, tt := range tests {
		if got := RunsOn(pods, tt.node, tt.sa); got != tt.want {
			t.Errorf("RunsOn(%s, %s) = %v", tt.node, tt.sa, got)
		}
	}
}

func sha256Of(s string) [32]byte { return sha256.Sum256([]byte(s)) }
