package meshlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// Kube puts the mesh in Kubernetes mode (Options.Kube): the control plane
// (ztunnel-cp --kubeconfig) and the node agents (ztunnel-cni --kubeconfig,
// and so the CNI plugin) read a real API server instead of the YAML
// directory, node proxies authenticate with pod-bound ServiceAccount
// tokens, and the mesh plays kubelet: AddKubePod stores the Pod, creates
// its sandbox through CNI and writes its status (Running, IP, Ready).
//
// The API servers listen on the test process's loopback; every node gets a
// forwarder on its own 127.0.0.1 at the same port, so one kubeconfig (the
// server's, or a remote secret's) works in every namespace.
type Kube struct {
	// API is this cluster's API server, its CRDs applied. Required.
	API *kubeapi.Server
	// ClusterID is ztunnel-cp --cluster-id; "" means its default.
	ClusterID string
	// Network is ztunnel-cp --network, the label
	// topology.istio.io/network of istio-system, and the node proxies'
	// NETWORK; "" means none.
	Network string
	// RootCert and RootKey are the mesh's root CA (PEM files), shared by
	// clusters of one mesh; "" means the control plane generates one in
	// its state directory.
	RootCert, RootKey string
	// Remote are other API servers the control plane reaches (remote
	// secrets' kubeconfigs): forwarded into every node like API.
	Remote []*kubeapi.Server
}

// Kubernetes names the mesh uses in Kubernetes mode.
const (
	SystemNamespace = "istio-system"
	// NodeProxyAccount is the node proxies' ServiceAccount in
	// SystemNamespace (ztunnel-cp --trusted-node-accounts' default).
	NodeProxyAccount = "ztunnel"
	// LabelNetwork names a namespace's (or pod's, or Gateway's) network.
	LabelNetwork = "topology.istio.io/network"
)

// kubeSetup runs after the cluster exists and before any process: API
// forwarders into every node, the Node objects, istio-system, and a
// ztunnel pod per node whose bound token the node proxy presents.
func (m *Mesh) kubeSetup(ctx context.Context) error {
	k := m.opts.Kube
	for _, s := range append([]*kubeapi.Server{k.API}, k.Remote...) {
		for _, n := range m.Cluster.Nodes() {
			if err := m.forwardAPI(n.NetNS, s); err != nil {
				return err
			}
		}
	}
	kc := k.API.Client()
	var labels map[string]string
	if k.Network != "" {
		labels = map[string]string{LabelNetwork: k.Network}
	}
	if err := k.API.EnsureNamespace(ctx, SystemNamespace, labels); err != nil {
		return fmt.Errorf("meshlab: %w", err)
	}
	if err := k.API.EnsureServiceAccount(ctx, SystemNamespace, NodeProxyAccount); err != nil {
		return fmt.Errorf("meshlab: %w", err)
	}
	for _, n := range m.Cluster.Nodes() {
		_, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("meshlab: node %s: %w", n.Name, err)
		}
	}
	return nil
}

// kubeNodeToken creates node n's ztunnel pod object and returns its bound
// token (audience istio-ca).
func (m *Mesh) kubeNodeToken(ctx context.Context, n *testcluster.Node) (string, error) {
	k := m.opts.Kube
	pod, err := k.API.Client().CoreV1().Pods(SystemNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: SystemNamespace, Name: "ztunnel-" + n.Name},
		Spec: corev1.PodSpec{NodeName: n.Name, ServiceAccountName: NodeProxyAccount, HostNetwork: true,
			Containers: []corev1.Container{{Name: "istio-proxy", Image: "ztunnel"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("meshlab: ztunnel pod of %s: %w", n.Name, err)
	}
	tok, err := k.API.CreatePodToken(ctx, pod, kubeapi.AudienceIstioCA)
	if err != nil {
		return "", fmt.Errorf("meshlab: %w", err)
	}
	return tok, nil
}

// forwardAPI listens on 127.0.0.1:<s's port> inside ns and relays every
// connection to s on the test process's loopback, until the test ends.
func (m *Mesh) forwardAPI(ns *testcluster.NetNS, s *kubeapi.Server) error {
	u, err := url.Parse(s.Host())
	if err != nil {
		return fmt.Errorf("meshlab: %w", err)
	}
	ln, err := ns.Listen(u.Host)
	if err != nil {
		return fmt.Errorf("meshlab: API forwarder in %s: %w", ns.NetNSName(), err)
	}
	m.mu.Lock()
	m.apps = append(m.apps, ln)
	m.mu.Unlock()
	go serveForward(ln, u.Host)
	return nil
}

// serveForward copies each connection accepted on ln to a new connection to
// target (dialled from the test process's own namespace).
func serveForward(ln net.Listener, target string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			u, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				return
			}
			defer u.Close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(u, c)
				_ = u.(*net.TCPConn).CloseWrite()
			}()
			_, _ = io.Copy(c, u)
			_ = c.(*net.TCPConn).CloseWrite()
			wg.Wait()
		}()
	}
}

// kubeCPArgs are ztunnel-cp's flags in Kubernetes mode.
func (m *Mesh) kubeCPArgs(stateDir string) []string {
	k := m.opts.Kube
	args := []string{
		"--kubeconfig", k.API.Kubeconfig(), "--listen", m.CPAddr.String(), "--state-dir", stateDir,
		"--trust-domain", m.opts.TrustDomain, "--admin", CPAdminAddr,
		"--metrics-addr", "", "--readiness-addr", "",
		"--system-namespace", SystemNamespace, "--lease-namespace", SystemNamespace,
	}
	if k.ClusterID != "" {
		args = append(args, "--cluster-id", k.ClusterID)
	}
	if k.Network != "" {
		args = append(args, "--network", k.Network)
	}
	if k.RootCert != "" {
		args = append(args, "--root-cert", k.RootCert, "--root-key", k.RootKey)
	}
	return args
}

// KubePod is a pod for AddKubePod.
type KubePod struct {
	testcluster.PodSpec
	// Node is the node index (spec.nodeName "node<i>").
	Node int
}

// AddKubePod plays scheduler and kubelet for a pod in Kubernetes mode:
// it stores the Pod bound to its node (Pending), creates the sandbox
// through the node's CNI chain (the mesh's plugin looks the pod up in the
// API and hands it to the agent), writes the status kubelet writes
// (Running, the pod IP, Ready) and runs an echo server on each TCP
// container port. It does not wait for the node proxies; see
// WaitForWorkloads.
func (m *Mesh) AddKubePod(ctx context.Context, kp KubePod) (*testcluster.Pod, error) {
	k := m.opts.Kube
	if k == nil {
		return nil, errors.New("meshlab: AddKubePod needs Options.Kube")
	}
	if kp.Node < 0 || kp.Node >= len(m.Nodes) {
		return nil, fmt.Errorf("meshlab: AddKubePod %s: no node %d", kp.Name, kp.Node)
	}
	spec := kp.PodSpec
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	sa := spec.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	if err := k.API.EnsureServiceAccount(ctx, spec.Namespace, sa); err != nil {
		return nil, fmt.Errorf("meshlab: %w", err)
	}
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: spec.Name, Labels: spec.Labels, Annotations: spec.Annotations},
		Spec:       corev1.PodSpec{NodeName: m.Nodes[kp.Node].Name, ServiceAccountName: sa},
	}
	for _, c := range spec.Containers {
		kc := corev1.Container{Name: c.Name, Image: c.Image}
		for _, p := range c.Ports {
			kc.Ports = append(kc.Ports, corev1.ContainerPort{Name: p.Name, ContainerPort: int32(p.Port), Protocol: corev1.Protocol(p.Protocol)})
		}
		obj.Spec.Containers = append(obj.Spec.Containers, kc)
	}
	if len(obj.Spec.Containers) == 0 {
		obj.Spec.Containers = []corev1.Container{{Name: "app", Image: "app"}}
	}
	kc := k.API.Client()
	obj, err := kc.CoreV1().Pods(spec.Namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("meshlab: pod %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	spec.UID = string(obj.UID)
	p, err := m.AddPod(ctx, kp.Node, spec)
	if err != nil {
		return nil, err
	}
	if err := m.SetPodReady(ctx, p, true); err != nil {
		return nil, err
	}
	return p, nil
}

// SetPodReady writes pod p's status as kubelet does: Running with its IP,
// and the Ready condition (false: the readiness probe fails, so the
// control plane takes its endpoints out of load balancing).
func (m *Mesh) SetPodReady(ctx context.Context, p *testcluster.Pod, ready bool) error {
	kc := m.opts.Kube.API.Client()
	st := corev1.ConditionTrue
	if !ready {
		st = corev1.ConditionFalse
	}
	// The node agent writes the pod too (its redirection status), so an
	// update may meet a newer version: read it again and retry. (A loop,
	// not client-go's retry package, which the demo binary does not link.)
	update := func() error {
		cur, err := kc.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status.Phase = corev1.PodRunning
		cur.Status.PodIP = p.IP.String()
		cur.Status.PodIPs = []corev1.PodIP{{IP: p.IP.String()}}
		cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		_, err = kc.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	}
	err := update()
	for try := 0; try < 5 && apierrors.IsConflict(err); try++ {
		err = update()
	}
	if err != nil {
		return fmt.Errorf("meshlab: pod %s/%s status: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// DeleteKubePod removes the pod as kubelet and the API server do: the
// sandbox (CNI DEL), then the object.
func (m *Mesh) DeleteKubePod(ctx context.Context, p *testcluster.Pod) error {
	err := p.Delete(ctx)
	m.mu.Lock()
	delete(m.pods, p.Namespace+"/"+p.Name)
	m.mu.Unlock()
	zero := int64(0)
	if derr := m.opts.Kube.API.Client().CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); derr != nil && !apierrors.IsNotFound(derr) {
		err = errors.Join(err, fmt.Errorf("meshlab: %w", derr))
	}
	return err
}

// KubeAPI is the mesh's API server in Kubernetes mode, else nil.
func (m *Mesh) KubeAPI() *kubeapi.Server {
	if m.opts.Kube == nil {
		return nil
	}
	return m.opts.Kube.API
}

// writeToken writes a token file readable by the processes.
func writeToken(path, tok string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("meshlab: %w", err)
	}
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return fmt.Errorf("meshlab: %w", err)
	}
	return nil
}

// kubeProxyEnv are the node proxies' extra variables in Kubernetes mode:
// the cluster's id and network (as the chart sets them).
func (m *Mesh) kubeProxyEnv() []string {
	k := m.opts.Kube
	if k == nil {
		return nil
	}
	var env []string
	if k.ClusterID != "" {
		env = append(env, "CLUSTER_ID="+k.ClusterID)
	}
	if k.Network != "" {
		env = append(env, "NETWORK="+k.Network)
	}
	return env
}
