// Package kube connects the node agent and the CNI plugin to the Kubernetes
// API: NewSource is the agent's cluster source (namespaces, and the pods of
// its own node via a spec.nodeName field selector); StatusWriter writes the
// agent's redirection state as the pod annotation
// ambient.istio.io/redirection (enabled|pending, removed otherwise) through
// the pods/status subresource, retrying in the background while the API
// server is away; PodSource is the plugin's pod and namespace lookup, retried
// (bounded) while the API server is briefly unavailable; WriteKubeconfig
// gives the plugin, which runs on the host, the agent's credentials.
//
// It decides nothing about enrollment (cni/plugin.IsAmbient) and captures
// nothing (cni/agent).
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/workqueue"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	clusterkube "github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// AnnotationRedirection is the pod annotation istiod keys HBONE enrollment off.
const AnnotationRedirection = "ambient.istio.io/redirection"

// AnnotationRedirectionError carries why a pod whose redirection is
// RedirectionFailed is not captured (e.g. its network namespace cannot be
// proven to be its own).
const AnnotationRedirectionError = "ztunnel-go.io/redirection-error"

// Annotation values. Only RedirectionEnabled makes istiod send HBONE to the
// pod.
const (
	RedirectionEnabled = "enabled"
	RedirectionPending = "pending"
	RedirectionFailed  = "failed"
)

// NewSource returns the agent's cluster source: namespaces and the pods
// scheduled on node.
func NewSource(client kubernetes.Interface, node string, log *zap.Logger) (*clusterkube.Source, error) {
	if node == "" {
		return nil, errors.New("kube: node name is required for the agent source")
	}
	return clusterkube.New(clusterkube.Config{
		Clients: &clusterkube.Clients{Kube: client}, Kinds: clusterkube.AgentKinds(), NodeName: node, Log: log,
	})
}

// AnnotationValue is the redirection annotation for an agent state: ""
// means the annotation is removed (the pod is not, or no longer, captured:
// istiod must not send HBONE to it); RedirectionFailed says the agent was
// asked to capture the pod and could not.
func AnnotationValue(s agent.State) string {
	switch s {
	case agent.StateEnabled:
		return RedirectionEnabled
	case agent.StatePending:
		return RedirectionPending
	case agent.StateFailed:
		return RedirectionFailed
	}
	return ""
}

// StatusWriter is the agent's agent.StatusWriter for Kubernetes. Writes are
// queued per pod (the latest wins) and done by Run with retries and
// backoff, so WriteStatus never blocks the agent on the API server. Each
// patch carries the pod's UID, so it cannot land on a newer pod of the
// same name.
type StatusWriter struct {
	client kubernetes.Interface
	src    cluster.Source
	log    *zap.Logger
	queue  workqueue.TypedRateLimitingInterface[string]

	mu   sync.Mutex
	want map[string]wantStatus // by UID
	// patched holds the UIDs this writer has patched: for them the
	// source's cache may lag behind our own write, so it is not trusted to
	// say a write is unnecessary. Pruned of pods the source no longer has.
	patched map[string]bool
}

type wantStatus struct {
	namespace, name string
	value           string // "" removes the annotation
	errText         string // AnnotationRedirectionError; "" removes it
}

// StatusConfig configures NewStatusWriter.
type StatusConfig struct {
	// Client patches pods/status. Required.
	Client kubernetes.Interface
	// Source, if set, is the agent's source: a pod whose cached annotation
	// already has the wanted value is not patched. nil: always patch.
	Source cluster.Source
	// Log: nil means no logging.
	Log *zap.Logger
}

// NewStatusWriter returns a writer; call Run to start writing.
func NewStatusWriter(cfg StatusConfig) (*StatusWriter, error) {
	if cfg.Client == nil {
		return nil, errors.New("kube: StatusConfig.Client is required")
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	rl := workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 10*time.Second)
	return &StatusWriter{
		client: cfg.Client, src: cfg.Source, log: log, want: map[string]wantStatus{}, patched: map[string]bool{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[string]{Name: "pod-redirection-status"}),
	}, nil
}

// WriteStatus implements agent.StatusWriter.
func (w *StatusWriter) WriteStatus(_ context.Context, s agent.PodStatus) error {
	ws := wantStatus{namespace: s.Namespace, name: s.Name, value: AnnotationValue(s.State)}
	if s.State == agent.StateFailed {
		ws.errText = s.Error
	}
	w.enqueue(s.UID, ws)
	return nil
}

// ClearStatus implements agent.StatusWriter.
func (w *StatusWriter) ClearStatus(_ context.Context, pod agent.PodRef) error {
	w.enqueue(pod.UID, wantStatus{namespace: pod.Namespace, name: pod.Name})
	return nil
}

func (w *StatusWriter) enqueue(uid string, s wantStatus) {
	w.mu.Lock()
	w.want[uid] = s
	w.mu.Unlock()
	w.queue.Add(uid)
}

// Run writes queued statuses until ctx is done.
func (w *StatusWriter) Run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	for {
		uid, quit := w.queue.Get()
		if quit {
			return
		}
		err := w.sync(ctx, uid)
		switch {
		case err == nil:
			w.queue.Forget(uid)
		case ctx.Err() != nil:
		default:
			w.log.Warn("writing pod redirection annotation failed; retrying", zap.String("uid", uid), zap.Error(err))
			w.queue.AddRateLimited(uid)
		}
		w.queue.Done(uid)
	}
}

// sync writes the latest wanted status of uid.
func (w *StatusWriter) sync(ctx context.Context, uid string) error {
	w.mu.Lock()
	s, ok := w.want[uid]
	w.mu.Unlock()
	if !ok {
		return nil
	}
	if w.cachedAlready(uid, s) {
		w.done(uid, s)
		return nil
	}
	ann := map[string]*string{AnnotationRedirection: nil, AnnotationRedirectionError: nil}
	if s.value != "" {
		ann[AnnotationRedirection] = &s.value
	}
	if s.errText != "" {
		ann[AnnotationRedirectionError] = &s.errText
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": uid, "annotations": ann}})
	if err != nil {
		return fmt.Errorf("kube: encode status patch: %w", err)
	}
	w.mu.Lock()
	w.patched[uid] = true
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = w.client.CoreV1().Pods(s.namespace).Patch(ctx, s.name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	switch {
	case err == nil:
		w.log.Debug("pod redirection annotation written", zap.String("pod", s.namespace+"/"+s.name), zap.String("value", s.value))
	case apierrors.IsNotFound(err), (apierrors.IsInvalid(err) || apierrors.IsConflict(err)) && !w.exists(ctx, s, uid):
		// The pod is gone, or its name now belongs to a newer pod (the UID
		// in the patch does not match): nothing of ours to write.
		w.log.Debug("pod gone; redirection annotation not written", zap.String("pod", s.namespace+"/"+s.name), zap.Error(err))
	default:
		return fmt.Errorf("kube: patch %s/%s status: %w", s.namespace, s.name, err)
	}
	w.done(uid, s)
	return nil
}

// done forgets uid's wanted status unless a newer one arrived meanwhile.
func (w *StatusWriter) done(uid string, s wantStatus) {
	w.mu.Lock()
	if w.want[uid] == s {
		delete(w.want, uid)
	}
	w.mu.Unlock()
}

// exists reports whether the pod with uid still exists (true when unsure).
func (w *StatusWriter) exists(ctx context.Context, s wantStatus, uid string) bool {
	p, err := w.client.CoreV1().Pods(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	return err != nil || string(p.UID) == uid
}

// cachedAlready reports whether the source shows the pod with the wanted
// annotation already (or, for a removal, shows no such pod with it), for a
// pod this writer never patched (the agent re-reporting pods after its own
// restart).
func (w *StatusWriter) cachedAlready(uid string, s wantStatus) bool {
	if w.src == nil {
		return false
	}
	objs, _ := w.src.Current()
	if objs == nil {
		return false
	}
	w.mu.Lock()
	patched := w.patched[uid]
	if len(w.patched) > 2*len(objs.Pods)+64 {
		live := map[string]bool{}
		for _, p := range objs.Pods {
			live[string(p.UID)] = true
		}
		for u := range w.patched {
			if !live[u] {
				delete(w.patched, u)
			}
		}
	}
	w.mu.Unlock()
	if patched {
		return false
	}
	for _, p := range objs.Pods {
		if string(p.UID) == uid {
			v, has := p.Annotations[AnnotationRedirection]
			e, hasErr := p.Annotations[AnnotationRedirectionError]
			if e != s.errText || (s.errText == "" && hasErr) {
				return false
			}
			return (s.value == "" && !has) || (s.value != "" && v == s.value)
		}
	}
	return false
}

// Pending reports how many pods have a status not yet written.
func (w *StatusWriter) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.want)
}

// Lookup defaults: DefaultAttempts tries, the wait doubling from
// DefaultInterval up to DefaultMaxInterval (about 25 s in all).
const (
	DefaultAttempts    = 30
	DefaultInterval    = 100 * time.Millisecond
	DefaultMaxInterval = time.Second
)

// PodSource is the plugin's plugin.PodSource on the Kubernetes API.
type PodSource struct {
	// Client reads pods and namespaces. Required.
	Client kubernetes.Interface
	// Attempts, Interval, MaxInterval bound the retries while the API server
	// is unavailable; 0 means the defaults.
	Attempts              int
	Interval, MaxInterval time.Duration
}

// NewPodSource builds a PodSource from a kubeconfig file (the plugin
// configuration's "kubeconfig" key). Its signature fits plugin.MainWith.
func NewPodSource(kubeconfig string) (plugin.PodSource, error) {
	rc, err := clusterkube.RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.Timeout = 5 * time.Second
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: client: %w", err)
	}
	return &PodSource{Client: c}, nil
}

// Lookup implements plugin.PodSource. The namespace is looked up even when
// the pod is absent, so the plugin can fail closed in ambient namespaces.
// Errors that retrying cannot fix (forbidden, unauthorized) return at once.
func (s *PodSource) Lookup(ctx context.Context, namespace, name string) (*corev1.Pod, *corev1.Namespace, error) {
	attempts, wait, maxWait := s.Attempts, s.Interval, s.MaxInterval
	if attempts <= 0 {
		attempts = DefaultAttempts
	}
	if wait <= 0 {
		wait = DefaultInterval
	}
	if maxWait <= 0 {
		maxWait = DefaultMaxInterval
	}
	policy := backoff.Policy{Initial: wait, Max: maxWait}
	var last error
	for i := 0; i < attempts; i++ {
		if i > 0 {
			t := time.NewTimer(policy.Delay(i, rand.Float64()))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, nil, fmt.Errorf("kube: looking up pod %s/%s: %w (last error: %v)", namespace, name, ctx.Err(), last)
			case <-t.C:
			}
		}
		pod, ns, err := s.lookupOnce(ctx, namespace, name)
		if err == nil || errors.Is(err, plugin.ErrPodNotFound) || !Retryable(err) {
			return pod, ns, err
		}
		last = err
	}
	return nil, nil, fmt.Errorf("kube: looking up pod %s/%s: API server unavailable after %d attempts: %w", namespace, name, attempts, last)
}

func (s *PodSource) lookupOnce(ctx context.Context, namespace, name string) (*corev1.Pod, *corev1.Namespace, error) {
	ns, err := s.Client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		ns, err = nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kube: get namespace %s: %w", namespace, err)
	}
	pod, err := s.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, ns, fmt.Errorf("kube: %s/%s: %w", namespace, name, plugin.ErrPodNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kube: get pod %s/%s: %w", namespace, name, err)
	}
	return pod, ns, nil
}

// Retryable reports whether an API error may go away by itself: the server
// unreachable, overloaded, timing out or failing internally.
func Retryable(err error) bool {
	var ne net.Error
	switch {
	case err == nil:
		return false
	case apierrors.IsUnauthorized(err), apierrors.IsForbidden(err), apierrors.IsBadRequest(err), apierrors.IsInvalid(err), apierrors.IsNotFound(err):
		return false
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsTooManyRequests(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err):
		return true
	case errors.As(err, &ne), errors.Is(err, context.DeadlineExceeded):
		return true
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return se.Status().Code >= 500
	}
	return true // transport errors that are not net.Errors (EOF, reset)
}

// WriteKubeconfig writes a kubeconfig for the plugin (which the container
// runtime runs on the host, outside the agent's pod) from the agent's own
// configuration: server, CA and bearer token inlined. It replaces the file
// atomically and reports whether the content changed, so callers can
// re-run it to follow token rotation.
func WriteKubeconfig(path string, rc *rest.Config) (bool, error) {
	token := rc.BearerToken
	if rc.BearerTokenFile != "" {
		b, err := os.ReadFile(rc.BearerTokenFile)
		if err != nil {
			return false, fmt.Errorf("kube: plugin kubeconfig: token: %w", err)
		}
		token = string(b)
	}
	ca := rc.CAData
	if len(ca) == 0 && rc.CAFile != "" {
		b, err := os.ReadFile(rc.CAFile)
		if err != nil {
			return false, fmt.Errorf("kube: plugin kubeconfig: CA: %w", err)
		}
		ca = b
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["cluster"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: ca, InsecureSkipTLSVerify: rc.Insecure}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: token, ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData,
		ClientCertificate: rc.CertFile, ClientKey: rc.KeyFile}
	kc.Contexts["default"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "agent"}
	kc.CurrentContext = "default"
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return false, fmt.Errorf("kube: plugin kubeconfig: %w", err)
	}
	if old, err := os.ReadFile(path); err == nil && string(old) == string(data) {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, fmt.Errorf("kube: plugin kubeconfig: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return false, fmt.Errorf("kube: plugin kubeconfig: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("kube: plugin kubeconfig: %w", err)
	}
	return true, nil
}
