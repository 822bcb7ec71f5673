package mclab

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

func clusterAdminBinding(sa string) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "mclab-" + sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "istio-system", Name: sa}},
	}
}

// kubeconfig is a self-contained kubeconfig (inline CA, bearer token): the
// only kind a remote secret may carry.
func kubeconfig(name, server string, caPEM []byte, token string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[2]s
    certificate-authority-data: %[3]s
users:
- name: %[1]s
  user:
    token: %[4]s
contexts:
- name: %[1]s
  context:
    cluster: %[1]s
    user: %[1]s
current-context: %[1]s
`, name, server, base64.StdEncoding.EncodeToString(caPEM), token)
}

func remoteSecret(name, cluster string, kc []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "istio-system",
			Labels:      map[string]string{LabelMultiCluster: "true"},
			Annotations: map[string]string{AnnotationClusterName: cluster},
		},
		Data: map[string][]byte{cluster: kc},
	}
}

// AmbientLabel enrolls a namespace's pods.
const AmbientLabel = "istio.io/dataplane-mode"

// EnsureAmbientNamespace creates namespace ns, enrolled in ambient, in c's
// API server.
func (c *Cluster) EnsureAmbientNamespace(ctx context.Context, ns string) error {
	return c.API.EnsureNamespace(ctx, ns, map[string]string{AmbientLabel: "ambient"})
}

// ServiceSpec is a one-port TCP Service for CreateService.
type ServiceSpec struct {
	Namespace, Name string
	Labels          map[string]string
	Selector        map[string]string
	Port            int
	TargetPort      int
	// TrafficDistribution is spec.trafficDistribution ("PreferClose": the
	// local network first); "" means none.
	TrafficDistribution string
}

// CreateService stores the Service in c's API server and returns its
// ClusterIP.
func (c *Cluster) CreateService(ctx context.Context, s ServiceSpec) (netip.Addr, error) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, Labels: s.Labels},
		Spec: corev1.ServiceSpec{
			Selector: s.Selector,
			Ports: []corev1.ServicePort{{Name: "tcp", Port: int32(s.Port), Protocol: corev1.ProtocolTCP,
				TargetPort: intstr.FromInt(s.TargetPort)}},
		},
	}
	if s.TrafficDistribution != "" {
		svc.Spec.TrafficDistribution = &s.TrafficDistribution
	}
	out, err := c.API.Client().CoreV1().Services(s.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("mclab: %s: service %s/%s: %w", c.Name, s.Namespace, s.Name, err)
	}
	ip, err := netip.ParseAddr(out.Spec.ClusterIP)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("mclab: %s: service %s/%s ClusterIP %q: %w", c.Name, s.Namespace, s.Name, out.Spec.ClusterIP, err)
	}
	return ip, nil
}

// ServeName runs a server on TCP port of pod p that writes name and a
// newline to every connection and closes it: the answer tells which
// endpoint (and so which cluster) a client reached.
func (c *Cluster) ServeName(p *testcluster.Pod, port int, name string) error {
	ln, err := p.Listen(fmt.Sprintf(":%d", port))
	if err != nil {
		return fmt.Errorf("mclab: %s/%s:%d: %w", p.Namespace, p.Name, port, err)
	}
	c.lab.tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = conn.Write([]byte(name + "\n"))
			}()
		}
	}()
	return nil
}

// Ask connects from pod p to addr and returns the first line the server
// wrote (see ServeName).
func Ask(ctx context.Context, p *testcluster.Pod, addr netip.AddrPort) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := p.Dial(ctx, "tcp", addr.String())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	var buf bytes.Buffer
	b := make([]byte, 256)
	for {
		n, err := conn.Read(b)
		buf.Write(b[:n])
		if i := bytes.IndexByte(buf.Bytes(), '\n'); i >= 0 {
			return string(buf.Bytes()[:i]), nil
		}
		if err != nil {
			return "", fmt.Errorf("read %q then: %w", buf.String(), err)
		}
	}
}

// ProxyHasWorkload reports whether node proxy node of c holds a workload
// whose uid is uid (its /config_dump).
func (c *Cluster) ProxyHasWorkload(ctx context.Context, node int, uid string) (bool, error) {
	body, err := c.ConfigDump(ctx, node)
	if err != nil {
		return false, err
	}
	return bytes.Contains(body, []byte(`"`+uid+`"`)), nil
}
