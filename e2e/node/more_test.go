package node

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The node tests of issue 16 beyond the first four: capture on a namespace
// label, an AuthorizationPolicy denial, STRICT PeerAuthentication, DNS
// capture answering a ServiceEntry, and the components' logs as kubectl
// logs shows them. Each runs through pods the kubelet runs.

const redirectionAnnotation = "ambient.istio.io/redirection"

// agentAdmin is the node agent's admin listener (--admin-addr; the agent's
// pod is hostNetwork, so it is the node's loopback).
const agentAdmin = "http://127.0.0.1:8000"

// agentPod is one entry of the agent's GET /pods.
type agentPod struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	State     string `json:"state"`
	Via       string `json:"via"`
	Netns     string `json:"netns"`
	Error     string `json:"error"`
}

// agentPods reads the node agent's GET /pods.
func agentPods(ctx context.Context) ([]agentPod, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, agentAdmin+"/pods", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent /pods: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("agent /pods: %s", resp.Status)
	}
	var out []agentPod
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("agent /pods: %w", err)
	}
	return out, nil
}

// agentPodByUID is the agent's record of the pod with uid, nil if none.
func agentPodByUID(ctx context.Context, uid types.UID) (*agentPod, error) {
	pods, err := agentPods(ctx)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].UID == string(uid) {
			return &pods[i], nil
		}
	}
	return nil, nil
}

// apply writes manifest to a file and kubectl-applies it; the objects are
// deleted at the end of t (their namespaces go too, this is for order).
func (e *nodeEnv) apply(t *testing.T, manifest string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), fmt.Sprintf("m%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, time.Minute)
	if out, err := e.node.Kubectl(ctx, "apply", "-f", path); err != nil {
		t.Fatalf("kubectl apply: %v\n%s\n%s", err, out, manifest)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = e.node.Kubectl(ctx, "delete", "--ignore-not-found", "--wait=false", "-f", path)
	})
}

// componentPod is the name of the running pod of a mesh DaemonSet (app=…).
func (e *nodeEnv) componentPod(t *testing.T, app string) string {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	pods, err := e.node.Client.CoreV1().Pods(systemNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			return p.Name
		}
	}
	t.Fatalf("no running %s pod in %s", app, systemNS)
	return ""
}

// logLine is one JSON line of a component's container log, with the time
// the kubelet recorded it.
type logLine struct {
	At     time.Time
	Fields map[string]any
}

func (l logLine) str(k string) string {
	s, _ := l.Fields[k].(string)
	return s
}

// podLog reads the pod's container log through the API server's pods/log
// (what kubectl logs does), the lines the kubelet stamped after since.
// Lines that are not JSON are skipped.
func (e *nodeEnv) podLog(ctx context.Context, ns, pod string, since time.Time) ([]logLine, error) {
	st := metav1.NewTime(since.Add(-time.Second)) // sinceTime has second precision; filtered below
	rc, err := e.node.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Timestamps: true, SinceTime: &st}).Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("pods/log %s/%s: %w", ns, pod, err)
	}
	defer rc.Close()
	var out []logLine
	sc := bufio.NewScanner(rc)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		stamp, rest, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil || at.Before(since) {
			continue
		}
		var f map[string]any
		if json.Unmarshal([]byte(rest), &f) != nil {
			continue
		}
		out = append(out, logLine{At: at, Fields: f})
	}
	if err := sc.Err(); err != nil && err != io.EOF {
		return out, fmt.Errorf("pods/log %s/%s: %w", ns, pod, err)
	}
	return out, nil
}

// accessLines are the node proxy's "connection complete" lines from src
// (an IP) to dst (ip:port) in direction. Over HBONE dst.addr is the peer's
// tunnel address (:15008) and dst.hbone_addr the target, as upstream logs it.
func accessLines(lines []logLine, src string, dst netip.AddrPort, direction string) []logLine {
	var out []logLine
	for _, l := range lines {
		if l.str("msg") != "connection complete" || l.str("direction") != direction {
			continue
		}
		target := l.str("dst.hbone_addr")
		if target == "" {
			target = l.str("dst.addr")
		}
		if !strings.HasPrefix(l.str("src.addr"), src+":") || target != dst.String() {
			continue
		}
		out = append(out, l)
	}
	return out
}

// accessLog waits until the node proxy's log since then has at least nIn
// inbound and nOut outbound access-log lines for connections from src to dst, reads
// it once more a moment later (a duplicate would come right after) and
// returns the lines of each direction and the whole log read.
func (e *nodeEnv) accessLog(t *testing.T, ctx context.Context, since time.Time, src string, dst netip.AddrPort, nIn, nOut int) (in, out, lines []logLine) {
	t.Helper()
	zt := e.componentPod(t, "ztunnel")
	read := func() error {
		var err error
		if lines, err = e.podLog(ctx, systemNS, zt, since); err != nil {
			return err
		}
		in, out = accessLines(lines, src, dst, "inbound"), accessLines(lines, src, dst, "outbound")
		return nil
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := read()
		if err == nil && len(in) >= nIn && len(out) >= nOut {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("after 20s: %d inbound and %d outbound access-log lines from %s to %s (%v), want %d and %d\nnode proxy log since %s:\n%s",
				len(in), len(out), src, dst, err, nIn, nOut, since.Format(time.RFC3339Nano), dumpLines(lines))
			return in, out, lines
		}
		time.Sleep(250 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if err := read(); err != nil {
		t.Error(err)
	}
	return in, out, lines
}

func dumpLines(lines []logLine) string {
	var b strings.Builder
	for _, l := range lines {
		data, _ := json.Marshal(l.Fields)
		fmt.Fprintf(&b, "%s %s\n", l.At.Format(time.RFC3339Nano), data)
	}
	return b.String()
}

// get runs testapp get in the pod and returns its output and error.
func (e *nodeEnv) get(ctx context.Context, ns, pod, url string) (string, error) {
	return e.exec(ctx, ns, pod, "/testapp", "get", "-timeout", "3s", url)
}

// expectGet fails t unless the pod's GET of url answers with want in the body.
func (e *nodeEnv) expectGet(t *testing.T, ctx context.Context, ns, pod, url, want string) {
	t.Helper()
	out, err := e.get(ctx, ns, pod, url)
	if err != nil || !strings.Contains(out, want) {
		t.Errorf("%s/%s GET %s: %v %q, want an answer from %s", ns, pod, url, err, out, want)
	}
}

// expectRefused fails t if the pod's GET of url succeeds.
func (e *nodeEnv) expectRefused(t *testing.T, ctx context.Context, ns, pod, url string) {
	t.Helper()
	if out, err := e.get(ctx, ns, pod, url); err == nil {
		t.Errorf("%s/%s GET %s answered %q, want it refused", ns, pod, url, out)
	}
}

func podURL(p *corev1.Pod, port int) (string, netip.AddrPort) {
	ap := netip.AddrPortFrom(netip.MustParseAddr(p.Status.PodIP), uint16(port))
	return "http://" + ap.String() + "/", ap
}

// TestNodeLabelCapture: a pod already running in a plain namespace is
// captured when the namespace is labelled ambient (the agent finds its
// network namespace by the pod's UID, reports it on /pods and in the
// ambient.istio.io/redirection annotation, installs the rules) and released
// when the label is removed: rules, annotation and agent record gone.
func TestNodeLabelCapture(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	const ns, cliNS = "label-cap", "label-cli"
	e.namespace(t, ns, false)
	e.namespace(t, cliNS, true)
	p := e.pod(t, ns, "app", nil, "serve")
	cli := e.pod(t, cliNS, "cli", nil, "pause")
	ctx := testCtx(t, 3*time.Minute)
	if r := e.podIptables(t, p); strings.Contains(r, "ISTIO_") {
		t.Fatalf("pod in a plain namespace has capture rules before the label:\n%s", r)
	}

	start := time.Now()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"ambient"}}}`, ambientLabel)
	if _, err := e.node.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var rec *agentPod
	waitUntil(t, 60*time.Second, func() error {
		var err error
		if rec, err = agentPodByUID(ctx, p.UID); err != nil {
			return err
		}
		if rec == nil || rec.State != "enabled" {
			return fmt.Errorf("agent /pods has %+v for pod uid %s, want enabled", rec, p.UID)
		}
		got, err := e.node.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if a := got.Annotations[redirectionAnnotation]; a != "enabled" {
			return fmt.Errorf("pod annotation %s=%q, want enabled", redirectionAnnotation, a)
		}
		r := e.podIptables(t, p)
		for _, want := range []string{"ISTIO_PRERT", "ISTIO_OUTPUT", "15001", "15006"} {
			if !strings.Contains(r, want) {
				return fmt.Errorf("no %q in the pod's rules yet", want)
			}
		}
		return nil
	})
	t.Logf("captured %v after the label: agent record %+v", time.Since(start).Round(time.Millisecond), *rec)
	if rec.Via != "watch" {
		t.Errorf("agent learned the running pod via %q, want watch (no CNI ADD for a running pod)", rec.Via)
	}
	if rec.Netns == "" {
		t.Errorf("agent record names no network namespace: %+v", *rec)
	}
	got, err := e.node.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != p.UID || got.Status.PodIP != p.Status.PodIP || got.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the pod was replaced or restarted to be captured: uid %s ip %s restarts %d (was %s %s)",
			got.UID, got.Status.PodIP, got.Status.ContainerStatuses[0].RestartCount, p.UID, p.Status.PodIP)
	}
	// Its traffic now goes through the node proxy: an ambient client's
	// connection arrives over HBONE (the control plane saw the label too).
	url, dst := podURL(p, 8080)
	waitUntil(t, 60*time.Second, func() error {
		since := time.Now()
		if _, err := e.get(ctx, cliNS, "cli", url); err != nil {
			return err
		}
		lines, err := e.podLog(ctx, systemNS, e.componentPod(t, "ztunnel"), since)
		if err != nil {
			return err
		}
		for _, l := range accessLines(lines, cli.Status.PodIP, dst, "inbound") {
			if l.str("dst.hbone_addr") == dst.String() && l.str("reason") == "" {
				return nil
			}
		}
		return fmt.Errorf("no clean inbound HBONE line from %s to %s yet", cli.Status.PodIP, dst)
	})

	start = time.Now()
	patch = fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, ambientLabel)
	if _, err := e.node.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, func() error {
		if r := e.podIptables(t, p); strings.Contains(r, "ISTIO_") {
			return fmt.Errorf("pod keeps capture rules after the label went")
		}
		rec, err := agentPodByUID(ctx, p.UID)
		if err != nil {
			return err
		}
		if rec != nil {
			return fmt.Errorf("agent still tracks the released pod: %+v", *rec)
		}
		got, err := e.node.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if a, ok := got.Annotations[redirectionAnnotation]; ok {
			return fmt.Errorf("pod keeps annotation %s=%q", redirectionAnnotation, a)
		}
		return nil
	})
	t.Logf("released %v after the label was removed", time.Since(start).Round(time.Millisecond))
}

// TestNodePolicyDenial: an AuthorizationPolicy DENY from one ambient
// namespace to port 8080 of the server pods refuses that peer on that port,
// while the same peer on another port and another peer on that port get
// through; the node proxy's access log (read through pods/log) has one
// line per refused connection in each direction, naming the policy.
func TestNodePolicyDenial(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	const srvNS, badNS, okNS = "pol-srv", "pol-denied", "pol-ok"
	for _, ns := range []string{srvNS, badNS, okNS} {
		e.namespace(t, ns, true)
	}
	srv := e.pod(t, srvNS, "srv", map[string]string{"app": "srv"}, "serve")
	srv2 := e.pod(t, srvNS, "srv2", map[string]string{"app": "srv"}, "serve", "-listen", ":9090")
	bad := e.pod(t, badNS, "cli", nil, "pause")
	e.pod(t, okNS, "cli", nil, "pause")
	ctx := testCtx(t, 4*time.Minute)
	url8080, dst8080 := podURL(srv, 8080)
	url9090, _ := podURL(srv2, 9090)
	// The node proxy learns the pods through xDS: wait until both peers
	// reach both servers before the policy.
	waitUntil(t, 60*time.Second, func() error {
		for _, c := range []struct{ ns, url string }{{badNS, url8080}, {badNS, url9090}, {okNS, url8080}} {
			if _, err := e.get(ctx, c.ns, "cli", c.url); err != nil {
				return err
			}
		}
		return nil
	})

	e.apply(t, fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-from-denied, namespace: %s}
spec:
  selector: {matchLabels: {app: srv}}
  action: DENY
  rules:
  - from: [{source: {namespaces: [%q]}}]
    to: [{operation: {ports: ["8080"]}}]
`, srvNS, badNS))
	start := time.Now()
	waitUntil(t, 60*time.Second, func() error {
		if out, err := e.get(ctx, badNS, "cli", url8080); err == nil {
			return fmt.Errorf("GET %s from %s still answers %q", url8080, badNS, out)
		}
		return nil
	})
	t.Logf("policy in force %v after it was applied", time.Since(start).Round(time.Millisecond))

	// Counted connections start now (the waits above made others).
	time.Sleep(time.Second)
	since := time.Now()
	const n = 3
	for range n {
		e.expectRefused(t, ctx, badNS, "cli", url8080)
	}
	e.expectGet(t, ctx, badNS, "cli", url9090, "pod=srv2")
	e.expectGet(t, ctx, okNS, "cli", url8080, "pod=srv ")

	in, out, lines := e.accessLog(t, ctx, since, bad.Status.PodIP, dst8080, n, n)
	if len(in) != n || len(out) != n {
		t.Errorf("%d inbound and %d outbound access-log lines for %d refused connections, want one each per connection", len(in), len(out), n)
	}
	for _, l := range in {
		if l.str("reason") != "policy_denied" || !strings.Contains(l.str("error"), srvNS+"/deny-from-denied") {
			t.Errorf("inbound line of a refused connection: reason %q error %q, want policy_denied naming %s/deny-from-denied", l.str("reason"), l.str("error"), srvNS)
		}
	}
	for _, l := range out {
		if l.str("reason") == "" {
			t.Errorf("outbound line of a refused connection has no failure reason: %v", l.Fields)
		}
	}
	if t.Failed() {
		t.Logf("node proxy log since %s:\n%s", since.Format(time.RFC3339Nano), dumpLines(lines))
	}
}

// TestNodeStrict: with a STRICT PeerAuthentication in the server's
// namespace, a plaintext client (a pod of a non-ambient namespace) is
// refused while an ambient client (HBONE, mTLS) still gets through; before
// the policy the plaintext client got through (PERMISSIVE), so the refusal
// is STRICT's.
func TestNodeStrict(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	const srvNS, ambNS, plainNS = "strict-srv", "strict-amb", "strict-plain"
	e.namespace(t, srvNS, true)
	e.namespace(t, ambNS, true)
	e.namespace(t, plainNS, false)
	srv := e.pod(t, srvNS, "srv", map[string]string{"app": "srv"}, "serve")
	amb := e.pod(t, ambNS, "cli", nil, "pause")
	plain := e.pod(t, plainNS, "cli", nil, "pause")
	ctx := testCtx(t, 3*time.Minute)
	url, dst := podURL(srv, 8080)
	waitUntil(t, 60*time.Second, func() error {
		for _, ns := range []string{ambNS, plainNS} {
			if _, err := e.get(ctx, ns, "cli", url); err != nil {
				return fmt.Errorf("before STRICT, from %s: %w", ns, err)
			}
		}
		return nil
	})

	e.apply(t, fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: %s}
spec:
  mtls: {mode: STRICT}
`, srvNS))
	start := time.Now()
	waitUntil(t, 60*time.Second, func() error {
		if out, err := e.get(ctx, plainNS, "cli", url); err == nil {
			return fmt.Errorf("plaintext GET %s still answers %q", url, out)
		}
		return nil
	})
	t.Logf("STRICT in force %v after it was applied", time.Since(start).Round(time.Millisecond))
	time.Sleep(time.Second)
	since := time.Now()
	const n = 3
	for range n {
		e.expectRefused(t, ctx, plainNS, "cli", url)
		e.expectGet(t, ctx, ambNS, "cli", url, "pod=srv ")
	}
	// The node proxy logs each refusal once, inbound (a plaintext client
	// has no outbound side), naming the policy STRICT becomes (upstream's
	// istio_converted_static_strict in the root namespace); the ambient
	// client's connections arrive with its identity.
	in, _, lines := e.accessLog(t, ctx, since, plain.Status.PodIP, dst, n, 0)
	if len(in) != n {
		t.Errorf("%d inbound access-log lines for %d refused plaintext connections, want one each", len(in), n)
	}
	for _, l := range in {
		if l.str("reason") != "policy_denied" || !strings.Contains(l.str("error"), "istio_converted_static_strict") || l.str("src.identity") != "" {
			t.Errorf("refused plaintext connection logged as reason %q error %q src.identity %q, want policy_denied by istio_converted_static_strict and no identity",
				l.str("reason"), l.str("error"), l.str("src.identity"))
		}
	}
	ambIn, _, _ := e.accessLog(t, ctx, since, amb.Status.PodIP, dst, n, n)
	for _, l := range ambIn {
		if l.str("reason") != "" || l.str("src.identity") != "spiffe://cluster.local/ns/"+ambNS+"/sa/default" {
			t.Errorf("ambient client's inbound line: reason %q src.identity %q, want a clean mTLS connection", l.str("reason"), l.str("src.identity"))
		}
	}
	if t.Failed() {
		t.Logf("node proxy log since %s:\n%s", since.Format(time.RFC3339Nano), dumpLines(lines))
	}
}

// TestNodeServiceEntryDNS: a ServiceEntry host without addresses gets one
// from the control plane's auto-allocation (status.addresses, in
// 240.240.0.0/16); an ambient pod resolving the host through its ordinary
// resolver (DNS captured to the node proxy, the default) gets that address,
// and a connection to it reaches the entry's STATIC endpoint, a server pod.
func TestNodeServiceEntryDNS(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	const ns, host = "se-dns", "api.ztg-node.test"
	e.namespace(t, ns, true)
	srv := e.pod(t, ns, "srv", map[string]string{"app": "srv"}, "serve")
	e.pod(t, ns, "cli", nil, "pause")
	ctx := testCtx(t, 3*time.Minute)
	e.apply(t, fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext-api, namespace: %s}
spec:
  hosts: [%q]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: TCP}]
  endpoints: [{address: %q, ports: {http: 8080}}]
`, ns, host, srv.Status.PodIP))

	// status.addresses, written by the control plane's leader.
	allocated := e.serviceEntryAddrs(t, ctx, ns, "ext-api", host)
	t.Logf("status.addresses of %s: %v", host, allocated)
	autoRange := netip.MustParsePrefix("240.240.0.0/16")

	since := time.Now()
	var answer []netip.Addr
	waitUntil(t, 60*time.Second, func() error {
		out, err := e.exec(ctx, ns, "cli", "/testapp", "lookup", "-timeout", "3s", host+".")
		if err != nil {
			return err
		}
		answer = answer[:0]
		for _, f := range strings.Fields(out) {
			ip, err := netip.ParseAddr(f)
			if err != nil {
				return fmt.Errorf("lookup printed %q: %w", out, err)
			}
			answer = append(answer, ip)
		}
		if len(answer) == 0 {
			return fmt.Errorf("lookup %s answered nothing", host)
		}
		return nil
	})
	t.Logf("the pod's resolver answered %s: %v", host, answer)
	var v4 netip.Addr
	for _, ip := range answer {
		found := false
		for _, a := range allocated {
			found = found || a == ip
		}
		if !found {
			t.Errorf("DNS answered %s for %s, not one of its status.addresses %v", ip, host, allocated)
		}
		if ip.Is4() {
			v4 = ip
			if !autoRange.Contains(ip) {
				t.Errorf("DNS answered %s for %s, outside the auto-allocation range %s", ip, host, autoRange)
			}
		}
	}
	if !v4.IsValid() {
		t.Fatalf("no IPv4 answer for %s: %v", host, answer)
	}

	waitUntil(t, 60*time.Second, func() error {
		out, err := e.get(ctx, ns, "cli", "http://"+host+"/")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "pod=srv ") {
			return fmt.Errorf("GET http://%s/ answered %q, want the endpoint pod", host, out)
		}
		return nil
	})
	// The node proxy answered the query (not the cluster DNS, which knows
	// nothing of the entry) and routed the connection as the ServiceEntry to
	// its endpoint. The access log names the endpoint in dst.addr, as
	// upstream does, not the virtual address dialled.
	cli, err := e.node.Client.CoreV1().Pods(ns).Get(ctx, "cli", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	zt := e.componentPod(t, "ztunnel")
	_, endpoint := podURL(srv, 8080)
	waitUntil(t, 20*time.Second, func() error {
		lines, err := e.podLog(ctx, systemNS, zt, since)
		if err != nil {
			return err
		}
		dns, conn := false, false
		for _, l := range lines {
			if l.str("msg") == "dns query" && l.str("domain") == host+"." && l.str("pod") == ns+"/cli" && l.str("query") == "A" && l.str("result") == "answered" {
				dns = true
			}
		}
		for _, l := range accessLines(lines, cli.Status.PodIP, endpoint, "outbound") {
			conn = conn || (l.str("dst.service") == host && l.str("reason") == "")
		}
		if !dns || !conn {
			return fmt.Errorf("node proxy log: DNS answer for %s logged %v, a clean outbound connection to %s as service %s logged %v:\n%s", host, dns, endpoint, host, conn, dumpLines(lines))
		}
		return nil
	})
}

// TestNodeLogs: what kubectl logs shows of the mesh components. The node
// agent's log carries the CNI plugin's own lines for a new pod's ADD (the
// plugin runs under the container runtime, its stderr goes nowhere a user
// reads; Istio 1.11 made the agent carry them), and the node proxy's log has
// one access-log line per connection and direction.
func TestNodeLogs(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	const ns = "logs"
	e.namespace(t, ns, true)
	since := time.Now()
	srv := e.pod(t, ns, "srv", map[string]string{"app": "srv"}, "serve")
	cli := e.pod(t, ns, "cli", nil, "pause")
	ctx := testCtx(t, 3*time.Minute)

	agent := e.componentPod(t, "ztunnel-cni")
	var lines []logLine
	waitUntil(t, 20*time.Second, func() error {
		var err error
		if lines, err = e.podLog(ctx, systemNS, agent, since); err != nil {
			return err
		}
		for _, name := range []string{"srv", "cli"} {
			found := false
			for _, l := range lines {
				if strings.Contains(l.str("logger"), "plugin") && l.str("pod") == ns+"/"+name &&
					l.str("msg") == "pod handed to the node agent" && l.str("plugin_time") != "" {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("no CNI plugin line for the ADD of %s/%s in the agent's log", ns, name)
			}
		}
		return nil
	})
	if t.Failed() {
		t.Logf("agent log since %s:\n%s", since.Format(time.RFC3339Nano), dumpLines(lines))
	}

	url, dst := podURL(srv, 8080)
	waitUntil(t, 60*time.Second, func() error { _, err := e.get(ctx, ns, "cli", url); return err })
	time.Sleep(time.Second)
	since = time.Now()
	const n = 3
	for range n {
		e.expectGet(t, ctx, ns, "cli", url, "pod=srv ")
	}
	in, out, lines := e.accessLog(t, ctx, since, cli.Status.PodIP, dst, n, n)
	if len(in) != n || len(out) != n {
		t.Errorf("%d inbound and %d outbound access-log lines for %d connections, want one each per connection", len(in), len(out), n)
	}
	for _, l := range append(in, out...) {
		if l.str("reason") != "" || l.str("src.workload") != "cli" || l.str("dst.workload") != "srv" {
			t.Errorf("access-log line %v: want a clean cli -> srv connection", l.Fields)
		}
	}
	if t.Failed() {
		t.Logf("node proxy log since %s:\n%s", since.Format(time.RFC3339Nano), dumpLines(lines))
	}
}
