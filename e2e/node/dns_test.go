package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/realnode"
)

// TestNodeClusterDNS: DNS capture against the real cluster resolver,
// CoreDNS (realnode's kube-system/coredns behind Service kube-dns). Pods'
// resolv.conf points at kube-dns. From a captured ambient pod: (a) a
// ServiceEntry host is answered by the node proxy itself with its
// auto-allocated address (CoreDNS knows nothing of it); (b) Kubernetes
// Service names resolve to their ClusterIPs, also answered by the node
// proxy; (c) realnode.OutsideName,
// which the node proxy does not know, is forwarded to CoreDNS, which
// answers it (its hosts plugin) — the node proxy logs the query forwarded
// and CoreDNS logs it from the pod. (d) From a pod outside the mesh the
// same names get what CoreDNS alone answers: the Service names and
// OutsideName the same, the ServiceEntry host NXDOMAIN, and the node proxy
// sees none of its queries.
func TestNodeClusterDNS(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	const ambNS, plainNS, host = "dns-amb", "dns-plain", "se.ztg-dns.test"
	e.namespace(t, ambNS, true)
	e.namespace(t, plainNS, false)
	srv := e.pod(t, ambNS, "srv", map[string]string{"app": "srv"}, "serve")
	amb := e.pod(t, ambNS, "cli", nil, "pause")
	plain := e.pod(t, plainNS, "cli", nil, "pause")
	ctx := testCtx(t, 4*time.Minute)
	e.apply(t, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: srv, namespace: %[1]s}
spec:
  selector: {app: srv}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: %[1]s}
spec:
  hosts: [%[2]q]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: TCP}]
  endpoints: [{address: %[3]q, ports: {http: 8080}}]
`, ambNS, host, srv.Status.PodIP))
	svc, err := e.node.Client.CoreV1().Services(ambNS).Get(ctx, "srv", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocated := e.serviceEntryAddrs(t, ctx, ambNS, "ext", host)
	t.Logf("status.addresses of %s: %v", host, allocated)

	services := []struct{ name, want string }{
		{"kubernetes.default.svc.cluster.local.", realnode.KubernetesServiceIP},
		{"srv." + ambNS + ".svc.cluster.local.", svc.Spec.ClusterIP},
	}
	outside := realnode.OutsideName + "."
	since := time.Now()

	// (a) The ServiceEntry host, from the ambient pod: the node proxy's answer.
	var got []netip.Addr
	waitUntil(t, 60*time.Second, func() error {
		got, err = e.lookup(ctx, ambNS, "cli", host+".")
		if err != nil {
			return err
		}
		if len(got) == 0 {
			return fmt.Errorf("lookup %s answered nothing", host)
		}
		return nil
	})
	for _, ip := range got {
		if !slices.Contains(allocated, ip) {
			t.Errorf("ambient pod: %s resolved to %s, not one of its status.addresses %v", host, ip, allocated)
		}
	}
	// (b) Service names, from both pods.
	for _, pod := range []*corev1.Pod{amb, plain} {
		for _, s := range services {
			e.expectLookup(t, ctx, pod, s.name, s.want)
		}
	}
	// (c) and (d): the name only CoreDNS knows, from both pods.
	for _, pod := range []*corev1.Pod{amb, plain} {
		e.expectLookup(t, ctx, pod, outside, realnode.OutsideAddr)
	}
	// (d) The ServiceEntry host from outside the mesh: CoreDNS says it does not exist.
	out, err := e.exec(ctx, plainNS, "cli", "/testapp", "lookup", "-timeout", "3s", host+".")
	if err == nil || !strings.Contains(out, "no such host") {
		t.Errorf("non-ambient pod: lookup %s: %v %q, want NXDOMAIN (no such host) from the cluster DNS", host, err, out)
	}

	// What each resolver saw. The node proxy: the ambient pod's ServiceEntry
	// query answered, its OutsideName query forwarded and answered
	// upstream, nothing of the non-ambient pod.
	zt := e.componentPod(t, "ztunnel")
	waitUntil(t, 20*time.Second, func() error {
		lines, err := e.podLog(ctx, systemNS, zt, since)
		if err != nil {
			return err
		}
		answered, forwarded := false, false
		svcAnswered := map[string]bool{}
		for _, l := range lines {
			if l.str("msg") != "dns query" || l.str("query") != "A" {
				continue
			}
			if l.str("pod") == plainNS+"/cli" || strings.HasPrefix(l.str("src.addr"), plain.Status.PodIP+":") {
				return fmt.Errorf("the node proxy saw a query of the non-ambient pod: %v", l.Fields)
			}
			if l.str("pod") != ambNS+"/cli" {
				continue
			}
			answered = answered || l.str("domain") == host+"." && l.str("result") == "answered"
			if l.str("result") == "answered" {
				svcAnswered[l.str("domain")] = true
			}
			forwarded = forwarded || l.str("domain") == outside && l.str("result") == "forwarded" && l.str("rcode") == "NOERROR" && l.Fields["answers"] == float64(1)
		}
		if !answered || !forwarded || !svcAnswered[services[0].name] || !svcAnswered[services[1].name] {
			return fmt.Errorf("node proxy log: %s answered %v, %s forwarded (NOERROR, 1 answer) %v, Service names answered %v:\n%s",
				host, answered, outside, forwarded, svcAnswered, dumpLines(lines))
		}
		return nil
	})
	// CoreDNS: OutsideName from both pods (the ambient pod's query by way of
	// the node proxy, sent from the pod's network namespace), the Service
	// names and the ServiceEntry host (NXDOMAIN) only from the non-ambient
	// pod: the node proxy answered those itself for the ambient one.
	waitUntil(t, 20*time.Second, func() error {
		qs, raw, err := e.corednsQueries(ctx, since)
		if err != nil {
			return err
		}
		saw := func(src, name, rcode string) bool {
			for _, q := range qs {
				if q.src == src && q.name == name && q.qtype == "A" && q.rcode == rcode {
					return true
				}
			}
			return false
		}
		var missing []string
		for _, w := range []struct{ src, name, rcode string }{
			{amb.Status.PodIP, outside, "NOERROR"},
			{plain.Status.PodIP, outside, "NOERROR"},
			{plain.Status.PodIP, host + ".", "NXDOMAIN"},
			{plain.Status.PodIP, services[0].name, "NOERROR"},
			{plain.Status.PodIP, services[1].name, "NOERROR"},
		} {
			if !saw(w.src, w.name, w.rcode) {
				missing = append(missing, fmt.Sprintf("%s A from %s %s", w.name, w.src, w.rcode))
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("CoreDNS did not log %v; its log since %s:\n%s", missing, since.Format(time.RFC3339), raw)
		}
		for _, q := range qs {
			if q.src == amb.Status.PodIP && (q.name == host+"." || q.name == services[0].name || q.name == services[1].name) {
				return fmt.Errorf("CoreDNS was asked for %s by the ambient pod, which the node proxy answers: %+v", q.name, q)
			}
		}
		return nil
	})
}

// serviceEntryAddrs waits for the control plane's status.addresses of the
// ServiceEntry's host and returns them.
func (e *nodeEnv) serviceEntryAddrs(t *testing.T, ctx context.Context, ns, name, host string) []netip.Addr {
	t.Helper()
	var allocated []netip.Addr
	waitUntil(t, 60*time.Second, func() error {
		out, err := e.node.Kubectl(ctx, "get", "serviceentries.networking.istio.io", "-n", ns, name, "-o", "jsonpath={.status.addresses}")
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) == "" {
			return fmt.Errorf("no status.addresses yet")
		}
		var addrs []struct {
			Value string `json:"value"`
			Host  string `json:"host"`
		}
		if err := json.Unmarshal([]byte(out), &addrs); err != nil {
			return fmt.Errorf("status.addresses %q: %w", out, err)
		}
		allocated = allocated[:0]
		for _, a := range addrs {
			if ip, err := netip.ParseAddr(a.Value); err == nil && a.Host == host {
				allocated = append(allocated, ip)
			}
		}
		if len(allocated) == 0 {
			return fmt.Errorf("status.addresses %s has none for %s", out, host)
		}
		return nil
	})
	return allocated
}

// lookup resolves name in the pod through its resolv.conf (testapp lookup).
func (e *nodeEnv) lookup(ctx context.Context, ns, pod, name string) ([]netip.Addr, error) {
	out, err := e.exec(ctx, ns, pod, "/testapp", "lookup", "-timeout", "3s", name)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	for _, f := range strings.Fields(out) {
		ip, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("lookup %s printed %q: %w", name, out, err)
		}
		addrs = append(addrs, ip)
	}
	return addrs, nil
}

// expectLookup: name resolves in the pod to exactly want.
func (e *nodeEnv) expectLookup(t *testing.T, ctx context.Context, pod *corev1.Pod, name, want string) {
	t.Helper()
	var got []netip.Addr
	waitUntil(t, 30*time.Second, func() error {
		var err error
		got, err = e.lookup(ctx, pod.Namespace, pod.Name, name)
		return err
	})
	if len(got) != 1 || got[0].String() != want {
		t.Errorf("pod %s/%s: %s resolved to %v, want [%s]", pod.Namespace, pod.Name, name, got, want)
	}
}

// corednsQuery is one line of CoreDNS's log plugin.
type corednsQuery struct {
	src, qtype, name, proto, rcode string
}

// The log plugin's default format: {remote}:{port} - {>id} "{type} {class}
// {name} {proto} {size} {>do} {>bufsize}" {rcode} {>rflags} {rsize} {duration}.
var corednsLogLine = regexp.MustCompile(`\[INFO\] (\S+) - \d+ "(\S+) IN (\S+) (udp|tcp) [^"]*" (\S+) `)

// corednsQueries are the queries CoreDNS's pods logged since since, and the
// raw log.
func (e *nodeEnv) corednsQueries(ctx context.Context, since time.Time) ([]corednsQuery, string, error) {
	raw, err := e.node.Kubectl(ctx, "logs", "-n", realnode.DNSNamespace, "-l", realnode.DNSLabel+"=kube-dns",
		"--since-time", since.Add(-time.Second).UTC().Format(time.RFC3339), "--tail=-1")
	if err != nil {
		return nil, raw, err
	}
	var qs []corednsQuery
	for _, l := range strings.Split(raw, "\n") {
		m := corednsLogLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		h, _, err := net.SplitHostPort(m[1])
		if err != nil {
			continue
		}
		qs = append(qs, corednsQuery{src: h, qtype: m[2], name: m[3], proto: m[4], rcode: m[5]})
	}
	return qs, raw, nil
}
