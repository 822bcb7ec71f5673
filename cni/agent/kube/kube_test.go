package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
)

func TestAnnotationValue(t *testing.T) {
	tests := map[agent.State]string{
		agent.StateEnabled: RedirectionEnabled,
		agent.StatePending: RedirectionPending,
		agent.StateFailed:  RedirectionFailed,
	}
	for s, want := range tests {
		if got := AnnotationValue(s); got != want {
			t.Errorf("AnnotationValue(%s) = %q, want %q", s, got, want)
		}
	}
}

func TestRetryable(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"not found", apierrors.NewNotFound(gr, "a"), false},
		{"forbidden", apierrors.NewForbidden(gr, "a", errors.New("rbac")), false},
		{"unauthorized", apierrors.NewUnauthorized("bad token"), false},
		{"service unavailable", apierrors.NewServiceUnavailable("starting"), true},
		{"too many requests", apierrors.NewTooManyRequests("slow down", 1), true},
		{"internal", apierrors.NewInternalError(errors.New("etcd")), true},
		{"timeout", apierrors.NewTimeoutError("slow", 1), true},
		{"connection refused", fmt.Errorf("get: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), true},
		{"deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), true},
	}
	for _, tt := range tests {
		if got := Retryable(tt.err); got != tt.want {
			t.Errorf("%s: Retryable = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestLookupBounded: with nothing listening, Lookup retries exactly the
// configured number of times and says the API server is unavailable.
func TestLookupBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // now refused
	c := kubernetes.NewForConfigOrDie(&rest.Config{Host: "https://" + addr, Timeout: time.Second})
	s := &PodSource{Client: c, Attempts: 3, Interval: 10 * time.Millisecond, MaxInterval: 20 * time.Millisecond}
	_, _, err = s.Lookup(context.Background(), "ns", "pod")
	if err == nil || !strings.Contains(err.Error(), "after 3 attempts") || errors.Is(err, plugin.ErrPodNotFound) {
		t.Fatalf("err = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.Attempts = 100
	if _, _, err := s.Lookup(ctx, "ns", "pod"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled lookup: %v", err)
	}
}

func TestWriteKubeconfig(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("tok-1"), 0o600); err != nil {
		t.Fatal(err)
	}
	rc := &rest.Config{Host: "https://10.96.0.1:443", BearerTokenFile: tokenFile, TLSClientConfig: rest.TLSClientConfig{CAData: []byte("CA")}}
	path := filepath.Join(dir, "net.d", "ztunnel-cni-kubeconfig")
	for i, want := range []bool{true, false} {
		changed, err := WriteKubeconfig(path, rc)
		if err != nil || changed != want {
			t.Fatalf("write %d: changed=%v err=%v", i, changed, err)
		}
	}
	if err := os.WriteFile(tokenFile, []byte("tok-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := WriteKubeconfig(path, rc); err != nil || !changed {
		t.Fatalf("rotated token: changed=%v err=%v", changed, err)
	}
	got, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Host != rc.Host || got.BearerToken != "tok-2" || string(got.CAData) != "CA" {
		t.Fatalf("loaded %+v", got)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
}

func TestStatusWriterQueuesLatest(t *testing.T) {
	w, err := NewStatusWriter(StatusConfig{Client: kubernetes.NewForConfigOrDie(&rest.Config{Host: "https://127.0.0.1:1"})})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_ = w.WriteStatus(ctx, agent.PodStatus{UID: "u1", Namespace: "ns", Name: "a", State: agent.StatePending})
	_ = w.WriteStatus(ctx, agent.PodStatus{UID: "u1", Namespace: "ns", Name: "a", State: agent.StateEnabled})
	_ = w.ClearStatus(ctx, agent.PodRef{UID: "u2", Namespace: "ns", Name: "b"})
	if w.Pending() != 2 || w.want["u1"].value != RedirectionEnabled || w.want["u2"].value != "" {
		t.Fatalf("want = %+v", w.want)
	}
	if _, err := NewStatusWriter(StatusConfig{}); err == nil {
		t.Fatal("missing client accepted")
	}
}
