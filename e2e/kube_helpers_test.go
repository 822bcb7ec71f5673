package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ztunnel-go/ztunnel-go/internal/api/caapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubeauth"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubestatus"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/xdstest"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// startKubeAPI starts a real API server with the CRDs ztunnel-go reads.
func startKubeAPI(t *testing.T) *kubeapi.Server {
	t.Helper()
	s := kubeapi.Start(t, kubeapi.Options{})
	if err := s.ApplyCRDs(ctxT(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	return s
}

func kubeClients(t *testing.T, s *kubeapi.Server) *kube.Clients {
	t.Helper()
	c, err := kube.NewClients(s.Config())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createNode creates a Node object (what kubelet registers), so tokens
// bound to pods on it carry its name.
func createNode(t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	if _, err := c.CoreV1().Nodes().Create(ctxT(t, 10*time.Second), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// kubePod is what kubelet would be asked to run.
type kubePod struct {
	ns, name, node, sa string
	labels, annots     map[string]string
}

// createPod stores the Pod object as the scheduler leaves it: bound to a
// node, Pending, without an IP.
func createPod(t *testing.T, c kubernetes.Interface, p kubePod) *corev1.Pod {
	t.Helper()
	pod, err := c.CoreV1().Pods(p.ns).Create(ctxT(t, 10*time.Second), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, Labels: p.labels, Annotations: p.annots},
		Spec: corev1.PodSpec{
			NodeName: p.node, ServiceAccountName: p.sa,
			Containers: []corev1.Container{{Name: "app", Image: "app"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// setRunning writes what kubelet writes once the sandbox is up: phase
// Running, the pod IP, Ready.
func setRunning(t *testing.T, c kubernetes.Interface, pod *corev1.Pod, ip string) *corev1.Pod {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	cur, err := c.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.Phase = corev1.PodRunning
	cur.Status.PodIP = ip
	cur.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	out, err := c.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// xdsSink keeps what a real xds.Client received.
type xdsSink struct {
	*xdstest.Sink
	stop func() // disconnects the client
	// reg holds the client's istio_xds_* metrics (terminations tell whether
	// the stream ever dropped).
	reg *prometheus.Registry
}

// terminations counts how often the client's xDS stream ended.
func (s *xdsSink) terminations(t *testing.T) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "istio_xds_connection_terminations_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// kubeCP is a control plane in Kubernetes mode, wired as cmd/ztunnel-cp
// wires it, with a short Lease so a restart takes over quickly.
type kubeCP struct {
	cp     *controlplane.ControlPlane
	status *kubestatus.Writer
	addr   string
	cancel context.CancelFunc
	done   chan struct{}
}

func startKubeCP(t *testing.T, clients *kube.Clients, authority *ca.CA, identity string) *kubeCP {
	t.Helper()
	log := zaptest.NewLogger(t).Named(identity)
	src, err := kube.New(kube.Config{Clients: clients, Log: log.Named("source")})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := kubeauth.New(kubeauth.Config{Client: clients.Kube})
	if err != nil {
		t.Fatal(err)
	}
	status, err := kubestatus.New(kubestatus.Config{
		Istio: clients.Istio, Kube: clients.Kube, Source: src, Identity: identity, Log: log.Named("se-status"),
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := autoalloc.New(autoalloc.Config{Store: status})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.New(controlplane.Config{
		Source: src, Translate: translate.Config{}, Allocator: alloc, CA: authority, Auth: auth, Log: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &kubeCP{cp: cp, status: status, addr: lis.Addr().String(), cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = status.Run(ctx) }()
	go func() {
		defer wg.Done()
		if err := cp.Run(ctx, lis); err != nil {
			t.Errorf("control plane: %v", err)
		}
	}()
	go func() { wg.Wait(); close(k.done) }()
	t.Cleanup(k.stop)
	return k
}

func (k *kubeCP) stop() {
	k.cancel()
	<-k.done
}

// caClient dials k's CA as a node proxy does (TLS to
// istiod.istio-system.svc, trusting authority's root); the connection is
// closed when t ends.
func caClient(t *testing.T, k *kubeCP, authority *ca.CA) caapi.IstioCertificateServiceClient {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(authority.Root())
	conn, err := grpc.NewClient(k.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "istiod.istio-system.svc"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return caapi.NewIstioCertificateServiceClient(conn)
}

// watchXDS connects a real node-proxy xDS client with token.
func watchXDS(t *testing.T, k *kubeCP, authority *ca.CA, token, node string) *xdsSink {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(authority.Root())
	s := &xdsSink{Sink: xdstest.NewSink()}
	s.reg = prometheus.NewRegistry()
	c, err := xds.NewClient(xds.ClientConfig{
		Address: k.addr, RootCAs: pool, ServerName: "istiod.istio-system.svc", Token: token,
		Node: xds.NodeInfo{PodName: "ztunnel-" + node, PodNamespace: "istio-system", InstanceIPs: []string{"10.30.0.1"}, NodeName: node},
		Sink: s, Registerer: s.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	s.stop = func() { cancel(); <-done }
	t.Cleanup(s.stop)
	return s
}
