package realnode

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The cluster DNS is CoreDNS (hack/k8s/build.sh coredns, from its Go
// module, in the image CoreDNSImage of hack/images/testimage), run as a
// cluster runs it: Deployment kube-system/coredns with its ServiceAccount,
// ClusterRole and binding, a Corefile ConfigMap, and Service
// kube-system/kube-dns at DNSServiceIP, which the kubelet writes into the
// pods' resolv.conf. kube-system is not ambient, so CoreDNS's own traffic
// is never captured.
const (
	// DNSServiceIP is the ClusterIP of kube-system/kube-dns, the pods' resolver.
	DNSServiceIP = "10.234.0.10"
	// OutsideName is the one name outside the cluster the cluster DNS
	// answers (its hosts plugin), with OutsideAddr; it stands for an
	// external name a real cluster would forward upstream. Every other name
	// outside cluster.local gets NXDOMAIN from CoreDNS's own root zone:
	// this machine has no outside network to forward to. OutsideAddr is
	// in TEST-NET-2, not TEST-NET-1: the node's own address is in 192.0.2.0/24.
	OutsideName = "outside.ztg.test"
	OutsideAddr = "198.51.100.53"
	// DNSNamespace and DNSDeployment name CoreDNS's Deployment; its pods
	// carry DNSLabel=kube-dns, as kubeadm's do.
	DNSNamespace  = "kube-system"
	DNSDeployment = "coredns"
	DNSLabel      = "k8s-app"

	dnsPort       = 1053 // in the pod: unprivileged, so CoreDNS runs as non-root with no capability
	dnsHealthPort = 8080
	dnsReadyPort  = 8181
	dnsMetrics    = 9153
)

// corefile is a cluster's Corefile, as kubeadm's with three changes: it
// listens on dnsPort; the hosts plugin answers OutsideName; and where a
// cluster forwards to the node's resolv.conf, CoreDNS serves an empty root
// zone (file plugin) instead, so every other name is NXDOMAIN at once.
func corefile() string {
	return fmt.Sprintf(`.:%d {
    errors
    health {
        lameduck 5s
    }
    ready
    log
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    hosts {
        %s %s
        fallthrough
    }
    prometheus :%d
    file /etc/coredns/root.db .
    cache 30
    loop
    reload
    loadbalance
}
`, dnsPort, OutsideAddr, OutsideName, dnsMetrics)
}

// rootZone is the root zone the file plugin serves: only its apex records,
// so any name that reaches it does not exist.
const rootZone = `$ORIGIN .
$TTL 30
@ IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 30
@ IN NS ns.dns.cluster.local.
`

// deployClusterDNS creates CoreDNS's objects; the kubelet starts its pod
// once the node is up. They live in etcd, so they go with its data (Clean).
func deployClusterDNS(ctx context.Context, n *Node) error {
	labels := map[string]string{DNSLabel: "kube-dns"}
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: DNSNamespace, Labels: labels}
	}
	create := func(what string, err error) error {
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("realnode: cluster DNS %s: %w", what, err)
		}
		return nil
	}
	c := n.Client
	// kube-system is made by the API server shortly after it is ready.
	if err := waitNamespace(ctx, n, DNSNamespace); err != nil {
		return err
	}
	_, err := c.CoreV1().ServiceAccounts(DNSNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: meta(DNSDeployment)}, metav1.CreateOptions{})
	if err := create("service account", err); err != nil {
		return err
	}
	list := []string{"list", "watch"}
	_, err = c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns", Labels: labels},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "pods", "namespaces"}, Verbs: list},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: list},
		},
	}, metav1.CreateOptions{})
	if err := create("cluster role", err); err != nil {
		return err
	}
	_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns", Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:coredns"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: DNSDeployment, Namespace: DNSNamespace}},
	}, metav1.CreateOptions{})
	if err := create("cluster role binding", err); err != nil {
		return err
	}
	_, err = c.CoreV1().ConfigMaps(DNSNamespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: meta(DNSDeployment),
		Data: map[string]string{"Corefile": corefile(), "root.db": rootZone}}, metav1.CreateOptions{})
	if err := create("config map", err); err != nil {
		return err
	}
	one, no, yes := int32(1), false, true
	uid := int64(65532)
	probe := func(path string, port int) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt(port)}},
			PeriodSeconds: 2, TimeoutSeconds: 2, FailureThreshold: 5}
	}
	_, err = c.AppsV1().Deployments(DNSNamespace).Create(ctx, &appsv1.Deployment{
		ObjectMeta: meta(DNSDeployment),
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: DNSDeployment,
					PriorityClassName:  "system-cluster-critical",
					// CoreDNS resolves with the node's resolver, not itself.
					DNSPolicy:   corev1.DNSDefault,
					Tolerations: []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "coredns", Image: CoreDNSImage, ImagePullPolicy: corev1.PullNever,
						Args: []string{"-conf", "/etc/coredns/Corefile"},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: dnsPort, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: dnsPort, Protocol: corev1.ProtocolTCP},
							{Name: "metrics", ContainerPort: dnsMetrics, Protocol: corev1.ProtocolTCP},
						},
						VolumeMounts:   []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true}},
						LivenessProbe:  probe("/health", dnsHealthPort),
						ReadinessProbe: probe("/ready", dnsReadyPort),
						SecurityContext: &corev1.SecurityContext{
							RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: &yes,
							AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes,
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
					}},
					Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{
						ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: DNSDeployment}}}}},
				},
			},
		},
	}, metav1.CreateOptions{})
	if err := create("deployment", err); err != nil {
		return err
	}
	svcLabels := map[string]string{DNSLabel: "kube-dns", "kubernetes.io/name": "CoreDNS"}
	_, err = c.CoreV1().Services(DNSNamespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: DNSNamespace, Labels: svcLabels},
		Spec: corev1.ServiceSpec{ClusterIP: DNSServiceIP, Selector: labels, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromString("dns")},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("dns-tcp")},
			{Name: "metrics", Port: dnsMetrics, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("metrics")},
		}},
	}, metav1.CreateOptions{})
	return create("service", err)
}

func waitNamespace(ctx context.Context, n *Node, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := n.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("realnode: namespace %s: %w", name, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitClusterDNS waits until CoreDNS's Deployment is available and CoreDNS,
// reached through Service kube-dns as the pods reach it (kube-proxy's
// rules translate the node's own traffic too), answers a Service name
// (kubernetes.default, KubernetesServiceIP) and OutsideName, over UDP and TCP.
func (n *Node) waitClusterDNS(ctx context.Context, kubelet *proc) error {
	err := waitFor(ctx, 120*time.Second, kubelet, func() error {
		d, err := n.Client.AppsV1().Deployments(DNSNamespace).Get(ctx, DNSDeployment, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.AvailableReplicas < 1 {
			return fmt.Errorf("deployment %s/%s: %d of %d replicas available%s", DNSNamespace, DNSDeployment,
				d.Status.AvailableReplicas, *d.Spec.Replicas, n.dnsPodState(ctx))
		}
		for _, netw := range []string{"udp", "tcp"} {
			for _, q := range []struct{ name, want string }{
				{"kubernetes.default.svc.cluster.local.", KubernetesServiceIP},
				{OutsideName + ".", OutsideAddr},
			} {
				got, err := queryA(ctx, netw, net.JoinHostPort(DNSServiceIP, "53"), q.name)
				if err != nil {
					return err
				}
				if len(got) != 1 || got[0] != q.want {
					return fmt.Errorf("cluster DNS over %s answered %v for %s, want [%s]", netw, got, q.name, q.want)
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("realnode: cluster DNS (CoreDNS) not serving: %w", err)
	}
	return nil
}

// dnsPodState says why CoreDNS's pod is not ready yet, for the error.
func (n *Node) dnsPodState(ctx context.Context) string {
	pods, err := n.Client.CoreV1().Pods(DNSNamespace).List(ctx, metav1.ListOptions{LabelSelector: DNSLabel + "=kube-dns"})
	if err != nil || len(pods.Items) == 0 {
		return "; no pod yet"
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "; pod %s %s", p.Name, p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&b, " waiting %s %s", w.Reason, w.Message)
			}
			if t := cs.State.Terminated; t != nil {
				fmt.Fprintf(&b, " terminated %s %s", t.Reason, t.Message)
			}
			fmt.Fprintf(&b, " ready=%v restarts=%d", cs.Ready, cs.RestartCount)
		}
	}
	return b.String()
}

// queryA asks server (host:port) over netw ("udp" or "tcp") for name's A
// records and returns their addresses; an rcode other than NOERROR is an
// error.
func queryA(ctx context.Context, netw, server, name string) ([]string, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	cl := &dns.Client{Net: netw, Timeout: 2 * time.Second}
	r, _, err := cl.ExchangeContext(ctx, m, server)
	if err != nil {
		return nil, fmt.Errorf("query %s A over %s to %s: %w", name, netw, server, err)
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("query %s A over %s to %s: rcode %s", name, netw, server, dns.RcodeToString[r.Rcode])
	}
	var out []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out, nil
}
