package mclab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

var gatewayGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}

// StartGateway plays the east-west gateway's controller and kubelet: it
// stores Gateway istio-system/eastwest (class istio-east-west, labelled
// with the cluster's network, one HBONE listener terminating TLS) with
// status.addresses = the edge's WAN address, as a LoadBalancer would get,
// and runs cmd/waypoint --mode east-west in the edge with a token of
// ServiceAccount istio-system/eastwest. It returns once the gateway is
// ready (first xDS sync and certificate).
func (c *Cluster) StartGateway(ctx context.Context) error {
	gw := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1",
		"kind":       "Gateway",
		"metadata": map[string]any{
			"name": GatewayName, "namespace": meshlab.SystemNamespace,
			"labels": map[string]any{meshlab.LabelNetwork: c.Network},
		},
		"spec": map[string]any{
			"gatewayClassName": "istio-east-west",
			"listeners": []any{map[string]any{
				"name": "mesh", "port": int64(GatewayPort), "protocol": "HBONE",
				// Istio's east-west Gateway: mesh mTLS, no certificate refs.
				"tls": map[string]any{"mode": "Terminate",
					"options": map[string]any{"gateway.istio.io/tls-terminate-mode": "ISTIO_MUTUAL"}},
			}},
		},
	}}
	gws := c.API.Dynamic().Resource(gatewayGVR).Namespace(meshlab.SystemNamespace)
	created, err := gws.Create(ctx, gw, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("mclab: %s: Gateway: %w", c.Name, err)
	}
	created.Object["status"] = map[string]any{"addresses": []any{map[string]any{"type": "IPAddress", "value": c.GatewayIP.String()}}}
	if _, err := gws.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("mclab: %s: Gateway status: %w", c.Name, err)
	}
	pod, err := c.gatewayObjects(ctx)
	if err != nil {
		return err
	}
	tok, err := c.API.CreatePodToken(ctx, pod, kubeapi.AudienceIstioCA)
	if err != nil {
		return fmt.Errorf("mclab: %s: %w", c.Name, err)
	}
	proc, err := c.Edge.Start(testcluster.Process{Name: "eastwest-" + c.Name, Path: c.lab.bin(meshlab.BinWaypoint), Args: []string{
		"--mode", "east-west",
		"--network", c.Network,
		"--gateway", meshlab.SystemNamespace + "/" + GatewayName,
		"--xds-address", c.CPAddr.String(),
		"--root-cert", c.RootCert,
		"--token", tok,
		"--service-account", GatewayName,
		"--pod-name", GatewayName + "-0",
		"--node-name", EdgeNodeName,
		"--ip", EdgeUnderlayIP,
		"--listen", fmt.Sprintf("0.0.0.0:%d", GatewayPort),
		"--metrics-addr", fmt.Sprintf("0.0.0.0:%d", GatewayMetricsPort),
		"--readiness-addr", fmt.Sprintf("0.0.0.0:%d", GatewayReadyPort),
		"--admin-addr", GatewayAdminAddr,
	}})
	if err != nil {
		return err
	}
	c.Gateway = proc
	var last string
	for {
		code, body, err := c.EdgeHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", GatewayReadyPort))
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("%d %s %v", code, strings.TrimSpace(string(body)), err)
		select {
		case <-proc.Done():
			return fmt.Errorf("mclab: %s: east-west gateway exited: %v", c.Name, proc.Err())
		case <-ctx.Done():
			return fmt.Errorf("mclab: %s: east-west gateway not ready: %w (last answer: %s)", c.Name, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// EdgeNodeName is the Node the gateway's pod runs on (host network: the
// edge).
const EdgeNodeName = "edge"

// gatewayObjects stores what waypointctl and kubelet would leave for the
// gateway: the edge's Node, the gateway pod (host network on it, Running
// with the edge's cluster address, labelled with its Gateway and network)
// and its LoadBalancer Service whose ingress is the WAN address. It returns
// the pod.
func (c *Cluster) gatewayObjects(ctx context.Context) (*corev1.Pod, error) {
	kc := c.API.Client()
	if err := c.API.EnsureServiceAccount(ctx, meshlab.SystemNamespace, GatewayName); err != nil {
		return nil, err
	}
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: EdgeNodeName}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("mclab: %s: node: %w", c.Name, err)
	}
	labels := map[string]string{labelGatewayName: GatewayName, meshlab.LabelNetwork: c.Network}
	pod, err := kc.CoreV1().Pods(meshlab.SystemNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: meshlab.SystemNamespace, Name: GatewayName + "-0", Labels: labels},
		Spec: corev1.PodSpec{NodeName: EdgeNodeName, ServiceAccountName: GatewayName, HostNetwork: true,
			Containers: []corev1.Container{{Name: "istio-proxy", Image: "waypoint",
				Ports: []corev1.ContainerPort{{Name: "hbone", ContainerPort: GatewayPort}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("mclab: %s: gateway pod: %w", c.Name, err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = EdgeUnderlayIP
	pod.Status.PodIPs = []corev1.PodIP{{IP: EdgeUnderlayIP}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if pod, err = kc.CoreV1().Pods(meshlab.SystemNamespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("mclab: %s: gateway pod status: %w", c.Name, err)
	}
	svc, err := kc.CoreV1().Services(meshlab.SystemNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: meshlab.SystemNamespace, Name: GatewayName, Labels: labels},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{labelGatewayName: GatewayName},
			Ports: []corev1.ServicePort{{Name: "tls-hbone", Port: GatewayPort, Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("mclab: %s: gateway service: %w", c.Name, err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: c.GatewayIP.String()}}
	if _, err := kc.CoreV1().Services(meshlab.SystemNamespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("mclab: %s: gateway service status: %w", c.Name, err)
	}
	return pod, nil
}

const labelGatewayName = "gateway.networking.k8s.io/gateway-name"

// EdgeHTTP GETs url from inside the edge (the gateway's readiness, metrics
// and admin servers).
func (c *Cluster) EdgeHTTP(ctx context.Context, url string) (int, []byte, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return c.Edge.Dial(ctx, "tcp", addr)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("mclab: GET %s in %s's edge: %w", url, c.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// GatewayMetrics returns the east-west gateway's Prometheus text.
func (c *Cluster) GatewayMetrics(ctx context.Context) (string, error) {
	code, body, err := c.EdgeHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", GatewayMetricsPort))
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("mclab: %s gateway metrics: status %d", c.Name, code)
	}
	return string(body), err
}

func (l *Lab) bin(name string) string { return l.bins + "/" + name }

// Remote secrets (istioctl create-remote-secret's shape).
const (
	LabelMultiCluster      = "istio/multiCluster"
	AnnotationClusterName  = "networking.istio.io/cluster"
	remoteReaderAccount    = "istio-reader-service-account"
	remoteSecretNamePrefix = "istio-remote-secret-"
)

// RemoteSecretName is the Secret in istio-system that holds of's
// kubeconfig.
func RemoteSecretName(of *Cluster) string { return remoteSecretNamePrefix + of.Name }

// ApplyRemoteSecret stores in c's API server the remote secret of cluster
// of, as `istioctl create-remote-secret --name=<of> | kubectl apply` does:
// a kubeconfig with inline CA data and the token of a reader
// ServiceAccount of of's API server (bound to cluster-admin here, where
// Istio binds its istio-reader ClusterRole).
func (c *Cluster) ApplyRemoteSecret(ctx context.Context, of *Cluster) error {
	rc := of.API.Client()
	if err := of.API.EnsureServiceAccount(ctx, meshlab.SystemNamespace, remoteReaderAccount); err != nil {
		return err
	}
	_, err := rc.RbacV1().ClusterRoleBindings().Create(ctx, clusterAdminBinding(remoteReaderAccount), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("mclab: %s: reader binding: %w", of.Name, err)
	}
	tok, err := of.API.CreateServiceAccountToken(ctx, meshlab.SystemNamespace, remoteReaderAccount, "")
	if err != nil {
		return err
	}
	kc := kubeconfig(of.Name, of.API.Host(), of.API.CAPEM(), tok)
	s := remoteSecret(RemoteSecretName(of), of.Name, kc)
	_, err = c.API.Client().CoreV1().Secrets(meshlab.SystemNamespace).Create(ctx, s, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("mclab: %s: remote secret of %s: %w", c.Name, of.Name, err)
	}
	return nil
}

// DeleteRemoteSecret removes of's remote secret from c's API server.
func (c *Cluster) DeleteRemoteSecret(ctx context.Context, of *Cluster) error {
	err := c.API.Client().CoreV1().Secrets(meshlab.SystemNamespace).Delete(ctx, RemoteSecretName(of), metav1.DeleteOptions{})
	if err != nil {
		return fmt.Errorf("mclab: %s: delete remote secret of %s: %w", c.Name, of.Name, err)
	}
	return nil
}
