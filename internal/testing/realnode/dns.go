package realnode

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// DNSServiceIP is the ClusterIP of kube-system/kube-dns, the pods' resolver.
const DNSServiceIP = "10.234.0.10"

const dnsPort = 1053

// clusterDNS answers A queries for <service>.<namespace>.svc.cluster.local
// with the Service's ClusterIP, read from the API server at each query. It
// stands in for CoreDNS (not built here): Service kube-dns has no selector
// and an EndpointSlice pointing at this server on the node's address, so
// pods reach it through kube-proxy as they would reach CoreDNS. Names
// outside cluster.local are refused: no test traffic leaves the machine.
type clusterDNS struct {
	ServiceIP string
	client    kubernetes.Interface
	servers   []*dns.Server
}

func startClusterDNS(ctx context.Context, n *Node) (*clusterDNS, error) {
	d := &clusterDNS{ServiceIP: DNSServiceIP, client: n.Client}
	addr := net.JoinHostPort(n.IP, strconv.Itoa(dnsPort))
	for _, netw := range []string{"udp", "tcp"} {
		started := make(chan error, 1)
		srv := &dns.Server{Addr: addr, Net: netw, Handler: d, NotifyStartedFunc: func() { started <- nil }}
		go func() {
			if err := srv.ListenAndServe(); err != nil {
				started <- err
			}
		}()
		select {
		case err := <-started:
			if err != nil {
				d.Close()
				return nil, fmt.Errorf("cluster DNS %s %s: %w", netw, addr, err)
			}
		case <-time.After(5 * time.Second):
			d.Close()
			return nil, fmt.Errorf("cluster DNS %s %s: not started", netw, addr)
		}
		d.servers = append(d.servers, srv)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec: corev1.ServiceSpec{ClusterIP: DNSServiceIP, Ports: []corev1.ServicePort{
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(dnsPort)},
			{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(dnsPort)},
		}},
	}
	if _, err := n.Client.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		d.Close()
		return nil, fmt.Errorf("cluster DNS service: %w", err)
	}
	port := int32(dnsPort)
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	pn, pt := "dns", "dns-tcp"
	ready := true
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns-realnode", Namespace: "kube-system", Labels: map[string]string{
			discoveryv1.LabelServiceName: "kube-dns", discoveryv1.LabelManagedBy: "realnode"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{n.IP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &pn, Port: &port, Protocol: &udp}, {Name: &pt, Port: &port, Protocol: &tcp}},
	}
	if _, err := n.Client.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, es, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		d.Close()
		return nil, fmt.Errorf("cluster DNS endpoints: %w", err)
	}
	return d, nil
}

// Close stops the servers.
func (d *clusterDNS) Close() {
	for _, s := range d.servers {
		_ = s.Shutdown()
	}
}

// ServeDNS implements dns.Handler.
func (d *clusterDNS) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		_ = w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	const zone = ".svc.cluster.local."
	if !strings.HasSuffix(name, zone) && name != "cluster.local." && !strings.HasSuffix(name, ".cluster.local.") {
		m.Rcode = dns.RcodeRefused
		_ = w.WriteMsg(m)
		return
	}
	parts := strings.Split(strings.TrimSuffix(name, zone), ".")
	if !strings.HasSuffix(name, zone) || len(parts) != 2 {
		m.Rcode = dns.RcodeNameError
		_ = w.WriteMsg(m)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	svc, err := d.client.CoreV1().Services(parts[1]).Get(ctx, parts[0], metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		m.Rcode = dns.RcodeNameError
	case err != nil:
		m.Rcode = dns.RcodeServerFailure
	case q.Qtype == dns.TypeA && svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone:
		if ip := net.ParseIP(svc.Spec.ClusterIP).To4(); ip != nil {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: ip})
		}
	}
	_ = w.WriteMsg(m)
}
