package e2e

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ztunnel-go/ztunnel-go/cni/agent"
	agentkube "github.com/ztunnel-go/ztunnel-go/cni/agent/kube"
	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/api/caapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
	"go.uber.org/zap/zaptest"
)

const ambientLabel = "istio.io/dataplane-mode"

// TestKubeControlPlane runs the control plane on a real API server: pods,
// policies and ServiceEntries come from the API, node proxies authenticate
// with pod-bound ServiceAccount tokens, ServiceEntry addresses are written
// to status and survive a control-plane restart, and the control plane
// resyncs after an API server restart.
func TestKubeControlPlane(t *testing.T) {
	s := startKubeAPI(t)
	clients := kubeClients(t, s)
	kc := clients.Kube
	ctx := ctxT(t, 80*time.Second)
	createNode(t, kc, "node-a")
	createNode(t, kc, "node-b")
	if err := s.EnsureNamespace(ctx, "app", map[string]string{ambientLabel: "ambient"}); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureServiceAccount(ctx, "istio-system", "ztunnel"); err != nil {
		t.Fatal(err)
	}
	// Node proxies: ServiceAccount istio-system/ztunnel, one pod per node.
	ztA := createPod(t, kc, kubePod{ns: "istio-system", name: "ztunnel-a", node: "node-a", sa: "ztunnel"})
	ztB := createPod(t, kc, kubePod{ns: "istio-system", name: "ztunnel-b", node: "node-b", sa: "ztunnel"})
	tokA, err := s.CreatePodToken(ctx, ztA, kubeapi.AudienceIstioCA)
	if err != nil {
		t.Fatal(err)
	}
	tokB, err := s.CreatePodToken(ctx, ztB, kubeapi.AudienceIstioCA)
	if err != nil {
		t.Fatal(err)
	}
	// The agent annotated web after capturing it: HBONE.
	web := createPod(t, kc, kubePod{ns: "app", name: "web", node: "node-a", sa: "web",
		annots: map[string]string{agentkube.AnnotationRedirection: agentkube.RedirectionEnabled}})
	setRunning(t, kc, web, "10.31.0.10")

	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cp := startKubeCP(t, clients, authority, "cp-1")
	sink := watchXDS(t, cp, authority, tokA, "node-a")

	webUID := "Kubernetes//Pod/app/web"
	testkit.Eventually(t, waitTimeout, "web as an HBONE workload in xDS", func() bool {
		w := sink.Address(webUID).GetWorkload()
		return w != nil && w.GetTunnelProtocol() == workloadapi.TunnelProtocol_HBONE && w.GetNode() == "node-a" && w.GetServiceAccount() == "web"
	})

	t.Run("AuthorizationPolicy", func(t *testing.T) {
		ap := &securityv1.AuthorizationPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "deny-foo"},
			Spec: securityv1beta1.AuthorizationPolicy{
				Action: securityv1beta1.AuthorizationPolicy_DENY,
				Rules:  []*securityv1beta1.Rule{{From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{Namespaces: []string{"foo"}}}}}},
			},
		}
		if _, err := clients.Istio.SecurityV1().AuthorizationPolicies("app").Create(ctx, ap, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, waitTimeout, "the policy as an Authorization", func() bool {
			a := sink.Authorization("app/deny-foo")
			return a != nil && a.GetAction().String() == "DENY"
		})
	})

	t.Run("CA", func(t *testing.T) {
		cac := caClient(t, cp, authority)
		id := identity.MustNew("cluster.local", "app", "web")
		key, _ := identity.GenerateKey()
		csr, _ := identity.NewCSR(id, key)
		call := func(tok string) error {
			_, err := cac.CreateCertificate(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok), &caapi.IstioCertificateRequest{Csr: string(csr)})
			return err
		}
		if err := call(tokA); err != nil {
			t.Fatalf("node-a proxy asking for app/web (on node-a): %v", err)
		}
		if err := call(tokB); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("node-b proxy asking for app/web (on node-a): %v, want PermissionDenied", err)
		}
		// A token for another audience is not a CA credential.
		other, err := s.CreatePodToken(ctx, ztA, kubeapi.DefaultAudience)
		if err != nil {
			t.Fatal(err)
		}
		if err := call(other); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("token with audience %s: %v, want Unauthenticated", kubeapi.DefaultAudience, err)
		}
		// A workload's own token obtains its own identity only.
		webTok, err := s.CreatePodToken(ctx, web, kubeapi.AudienceIstioCA)
		if err != nil {
			t.Fatal(err)
		}
		if err := call(webTok); err != nil {
			t.Fatalf("app/web asking for itself: %v", err)
		}
		otherID := identity.MustNew("cluster.local", "istio-system", "ztunnel")
		csr2, _ := identity.NewCSR(otherID, key)
		_, err = cac.CreateCertificate(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+webTok), &caapi.IstioCertificateRequest{Csr: string(csr2)})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("app/web asking for istio-system/ztunnel: %v, want PermissionDenied", err)
		}
	})

	se := &networkingv1.ServiceEntry{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "ext"},
		Spec: networkingv1alpha3.ServiceEntry{
			Hosts:      []string{"api.example.com"},
			Ports:      []*networkingv1alpha3.ServicePort{{Number: 443, Name: "tls", Protocol: "TLS"}},
			Resolution: networkingv1alpha3.ServiceEntry_DNS,
		},
	}
	var first []string
	t.Run("ServiceEntry status.addresses", func(t *testing.T) {
		if _, err := clients.Istio.NetworkingV1().ServiceEntries("app").Create(ctx, se, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		first = waitSEAddresses(t, clients, sink, nil)
		if !cp.status.Leading() {
			t.Fatal("the only control plane does not lead")
		}
		// A second replica waits for the Lease and writes nothing.
		second := startKubeCP(t, clients, authority, "cp-2")
		time.Sleep(500 * time.Millisecond) // a few retry periods: it must stay a follower
		if second.status.Leading() {
			t.Fatal("two replicas lead at once")
		}
		second.stop()
	})

	// ServiceEntry addresses survive a control-plane restart. Not a
	// subtest: the new control plane lives until the end of the test.
	if first == nil {
		t.Fatal("no ServiceEntry addresses to keep")
	}
	sink.stop() // or the old control plane waits for the stream to end
	cp.stop()
	cp = startKubeCP(t, clients, authority, "cp-3")
	sink = watchXDS(t, cp, authority, tokA, "node-a")
	kept := waitSEAddresses(t, clients, sink, first)
	testkit.Eventually(t, waitTimeout, "the new control plane to lead", cp.status.Leading)
	// Leading, it re-reads the status and keeps it.
	time.Sleep(300 * time.Millisecond)
	if now := seStatus(t, clients); !slices.Equal(now, kept) {
		t.Fatalf("status changed after the new leader started: %v, then %v", kept, now)
	}

	t.Run("API server restart", func(t *testing.T) {
		dropsBefore := sink.terminations(t)
		s.Stop()
		// Meanwhile the control plane keeps serving what it had, and the
		// CNI plugin's lookup keeps retrying.
		if sink.Address(webUID) == nil {
			t.Fatal("workload lost while the API server is down")
		}
		type lookup struct {
			pod *corev1.Pod
			ns  *corev1.Namespace
			err error
		}
		looked := make(chan lookup, 1)
		go func() {
			src := &agentkube.PodSource{Client: kc, Interval: 100 * time.Millisecond, MaxInterval: 500 * time.Millisecond, Attempts: 200}
			p, n, err := src.Lookup(ctx, "app", "web")
			looked <- lookup{p, n, err}
		}()
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		r := <-looked
		if r.err != nil || r.pod == nil || r.pod.UID != web.UID || r.ns.Labels[ambientLabel] != "ambient" {
			t.Fatalf("plugin lookup across the restart: %+v", r)
		}
		if ok, why := plugin.IsAmbient(r.pod, r.ns, plugin.Enrollment{}); !ok {
			t.Fatalf("web not ambient: %s", why)
		}
		_, ns, err := (&agentkube.PodSource{Client: kc}).Lookup(ctx, "app", "nope")
		if !errors.Is(err, plugin.ErrPodNotFound) || ns == nil {
			t.Fatalf("absent pod: ns=%v err=%v, want ErrPodNotFound with the namespace", ns, err)
		}
		late := createPod(t, kc, kubePod{ns: "app", name: "late", node: "node-b", sa: "late",
			annots: map[string]string{agentkube.AnnotationRedirection: agentkube.RedirectionEnabled}})
		setRunning(t, kc, late, "10.31.1.10")
		testkit.Eventually(t, waitTimeout, "a pod created after the restart in xDS", func() bool {
			return sink.Address("Kubernetes//Pod/app/late").GetWorkload().GetTunnelProtocol() == workloadapi.TunnelProtocol_HBONE
		})
		// node-b's proxy may now obtain late's identity: the placement view resynced.
		id := identity.MustNew("cluster.local", "app", "late")
		key, _ := identity.GenerateKey()
		csr, _ := identity.NewCSR(id, key)
		_, err = caClient(t, cp, authority).CreateCertificate(
			metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tokB), &caapi.IstioCertificateRequest{Csr: string(csr)})
		if err != nil {
			t.Fatalf("node-b proxy asking for app/late after the restart: %v", err)
		}
		// The node proxy's established xDS stream outlived the API server's
		// absence: it never dropped, and the change above came over it.
		if d := sink.terminations(t) - dropsBefore; d != 0 {
			t.Fatalf("xDS stream dropped %v times while the API server restarted", d)
		}
	})

}

// seStatus reads app/ext's status.addresses as sorted "host=value" strings.
func seStatus(t *testing.T, clients *kube.Clients) []string {
	t.Helper()
	got, err := clients.Istio.NetworkingV1().ServiceEntries("app").Get(ctxT(t, 10*time.Second), "ext", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range got.Status.GetAddresses() {
		out = append(out, a.GetHost()+"="+a.GetValue())
	}
	slices.Sort(out)
	return out
}

// waitSEAddresses waits until app/ext has one IPv4 and one IPv6 address of
// the auto-allocation ranges in its status (equal to want, if given) and
// xDS serves the service with exactly those addresses.
func waitSEAddresses(t *testing.T, clients *kube.Clients, sink *xdsSink, want []string) []string {
	t.Helper()
	var got []string
	testkit.Eventually(t, waitTimeout, "status.addresses of app/ext", func() bool {
		got = seStatus(t, clients)
		if want != nil {
			return slices.Equal(got, want)
		}
		if len(got) != 2 {
			return false
		}
		var v4, v6 bool
		for _, g := range got {
			a, err := netip.ParseAddr(strings.TrimPrefix(g, "api.example.com="))
			v4 = v4 || (err == nil && netip.MustParsePrefix("240.240.0.0/16").Contains(a))
			v6 = v6 || (err == nil && netip.MustParsePrefix("2001:2::/48").Contains(a))
		}
		return v4 && v6
	})
	testkit.Eventually(t, waitTimeout, "the ServiceEntry's addresses in xDS", func() bool {
		svc := sink.Address("app/api.example.com").GetService()
		var served []string
		for _, a := range svc.GetAddresses() {
			if ip, ok := netip.AddrFromSlice(a.GetAddress()); ok {
				served = append(served, "api.example.com="+ip.String())
			}
		}
		slices.Sort(served)
		return slices.Equal(served, got)
	})
	return got
}

// TestKubeAgent runs the node agent on a real API server: it sees only its
// node's pods, labelling and unlabelling the namespace enrolls and
// unenrolls running pods (rules in their network namespaces, the node
// proxy told over ZDS), the redirection annotation is written through
// pods/status, and all of it still works after an API server restart. The
// test plays kubelet: Pod object, sandbox through the CNI chain, status.
func TestKubeAgent(t *testing.T) {
	roottest.Require(t)
	s := startKubeAPI(t)
	kc := s.Client()
	c := testcluster.New(t, testcluster.Options{})
	node := c.Node(0)
	ctx := ctxT(t, 80*time.Second)
	createNode(t, kc, node.Name)
	if err := s.EnsureNamespace(ctx, "mesh", nil); err != nil {
		t.Fatal(err)
	}
	sandboxes := map[string]*testcluster.Pod{}
	for _, name := range []string{"a", "b"} {
		obj := createPod(t, kc, kubePod{ns: "mesh", name: name, node: node.Name, sa: "app"})
		// Uncaptured: the plain chain (bridge, loopback); enrollment of
		// running pods is the agent's watch path.
		p, err := node.AddPod(ctx, testcluster.PodSpec{Name: name, Namespace: "mesh", ServiceAccount: "app", Uncaptured: true})
		if err != nil {
			t.Fatal(err)
		}
		sandboxes[name] = p
		setRunning(t, kc, obj, p.IP.String())
	}
	// A pod of another node is outside the agent's field selector.
	setRunning(t, kc, createPod(t, kc, kubePod{ns: "mesh", name: "elsewhere", node: "node-x", sa: "app"}), "10.31.9.9")

	dir := t.TempDir()
	zdsSock := filepath.Join(dir, "zds.sock")
	proxy := startStandIn(t, zdsSock)
	log := zaptest.NewLogger(t)
	src, err := agentkube.NewSource(kc, node.Name, log.Named("source"))
	if err != nil {
		t.Fatal(err)
	}
	sw, err := agentkube.NewStatusWriter(agentkube.StatusConfig{Client: kc, Source: src, Log: log.Named("status")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{
		NodeName: node.Name, Source: src, Status: sw, Log: log,
		ZDSSocket: zdsSock, PluginSocket: filepath.Join(dir, "plugin.sock"), StateDir: filepath.Join(dir, "state"),
		Host: nopHost{}, // the probe SNAT would go into this (root) namespace
		// The default iptables variant, as in a fresh node namespace (and as
		// nat() reads it), not the one this machine's own rules use.
		Applier: func(_ string, ns *netns.Handle) rules.Applier {
			return rules.NewKernelApplier(rules.KernelConfig{Netns: ns, Mode: rules.ModeDefault})
		},
		FindNetns: func(_ context.Context, pod *corev1.Pod, _ string) (string, *netns.Handle, error) {
			p := sandboxes[pod.Name]
			if p == nil || pod.Namespace != "mesh" {
				return "", nil, os.ErrNotExist
			}
			h, err := netns.Open(p.NetNSPath())
			return p.NetNSPath(), h, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { sw.Run(runCtx); done <- struct{}{} }()
	go func() {
		if err := a.Run(runCtx); err != nil {
			t.Errorf("agent: %v", err)
		}
		done <- struct{}{}
	}()
	t.Cleanup(func() { cancel(); <-done; <-done })
	proxy.wait("snapshot 0")

	annotation := func(name string) (string, bool) {
		p, err := kc.CoreV1().Pods("mesh").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := p.Annotations[agentkube.AnnotationRedirection]
		return v, ok
	}
	label := func(value *string) {
		t.Helper()
		v := "null"
		if value != nil {
			v = `"` + *value + `"`
		}
		patch := []byte(`{"metadata":{"labels":{"` + ambientLabel + `":` + v + `}}}`)
		if _, err := kc.CoreV1().Namespaces().Patch(ctx, "mesh", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ambient := "ambient"
	enrolled := func(when string) {
		t.Helper()
		label(&ambient)
		proxy.wait("add a", "add b")
		testkit.Eventually(t, waitTimeout, "redirection annotations "+when, func() bool {
			va, _ := annotation("a")
			vb, _ := annotation("b")
			return va == agentkube.RedirectionEnabled && vb == agentkube.RedirectionEnabled
		})
		for name, p := range sandboxes {
			if !strings.Contains(nat(t, p), redirect15001) {
				t.Fatalf("pod %s has no capture rules %s", name, when)
			}
		}
		if _, ok := annotation("elsewhere"); ok {
			t.Fatal("a pod of another node was annotated")
		}
	}
	unenrolled := func(when string) {
		t.Helper()
		label(nil)
		proxy.wait("del a", "del b")
		testkit.Eventually(t, waitTimeout, "annotations removed "+when, func() bool {
			_, oka := annotation("a")
			_, okb := annotation("b")
			return !oka && !okb
		})
		for name, p := range sandboxes {
			if strings.Contains(nat(t, p), redirect15001) {
				t.Fatalf("pod %s keeps capture rules %s", name, when)
			}
		}
	}

	enrolled("after labelling the namespace")
	unenrolled("after unlabelling the namespace")

	s.Stop()
	time.Sleep(500 * time.Millisecond) // the informers notice and back off
	if !a.Ready() {
		t.Fatal("agent not ready while the API server is down")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	enrolled("after an API server restart")
	unenrolled("after an API server restart")
}

// nopHost stands in for the node-side probe SNAT, which would be installed
// in the test process's (the machine's) own network namespace.
type nopHost struct{}

func (nopHost) Setup() error                   { return nil }
func (nopHost) AddPodIPs(_ []netip.Addr) error { return nil }
func (nopHost) DelPodIPs(_ []netip.Addr) error { return nil }
func (nopHost) Teardown() error                { return nil }

// TestKubeBinaries runs the shipped binaries in Kubernetes mode against the
// API server: ztunnel-cp --kubeconfig syncs, leads and stops cleanly on
// SIGTERM; the ztunnel-cni plugin with a "kubeconfig" key looks pods up in
// the API (a plain pod passes through, an ambient pod fails closed while
// no agent listens).
func TestKubeBinaries(t *testing.T) {
	s := startKubeAPI(t)
	ctx := ctxT(t, 60*time.Second)
	bin := testkit.BuildBinaries(t, binDir, "ztunnel-cp")
	cniBin := ztunnelCNI(t) // shared with the capture tests
	if err := s.EnsureNamespace(ctx, "mesh", map[string]string{ambientLabel: "ambient"}); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureNamespace(ctx, "plain", nil); err != nil {
		t.Fatal(err)
	}
	kc := s.Client()
	createPod(t, kc, kubePod{ns: "mesh", name: "amb", node: "n1"})
	createPod(t, kc, kubePod{ns: "plain", name: "web", node: "n1"})

	t.Run("ztunnel-cp", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		var out lockedBuffer
		cp := exec.Command(filepath.Join(bin, "ztunnel-cp"), "--kubeconfig", s.Kubeconfig(), "--listen", addr,
			"--state-dir", t.TempDir(), "--lease-namespace", "default")
		cp.Stdout, cp.Stderr = &out, &out
		if err := cp.Start(); err != nil {
			t.Fatal(err)
		}
		logs := func() string { return out.String() }
		testkit.Eventually(t, waitTimeout, "ztunnel-cp to sync and lead", func() bool {
			l := logs()
			return strings.Contains(l, "kubernetes informers synced") && strings.Contains(l, "leading: writing ServiceEntry status.addresses")
		})
		if err := cp.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := cp.Wait(); err != nil {
			t.Fatalf("ztunnel-cp exit: %v\n%s", err, logs())
		}
	})

	t.Run("plugin", func(t *testing.T) {
		add := func(ns, name string) (string, error) {
			conf := `{"cniVersion":"1.0.0","name":"ztg","type":"ztunnel-cni","kubeconfig":"` + s.Kubeconfig() +
				`","agent_socket":"` + filepath.Join(t.TempDir(), "none.sock") + `","prevResult":{"cniVersion":"1.0.0",` +
				`"interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],"ips":[{"interface":0,"address":"10.31.0.9/24"}]}}`
			cmd := exec.CommandContext(ctx, filepath.Join(cniBin, "ztunnel-cni"))
			cmd.Env = append(os.Environ(), "CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_NETNS=/var/run/netns/x", "CNI_IFNAME=eth0",
				"CNI_PATH="+cniBin, "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+ns+";K8S_POD_NAME="+name)
			cmd.Stdin = strings.NewReader(conf)
			out, err := cmd.Output()
			return string(out), err
		}
		if out, err := add("plain", "web"); err != nil || !strings.Contains(out, "10.31.0.9/24") {
			t.Fatalf("plain pod: %v: %s", err, out)
		}
		out, err := add("mesh", "amb")
		if err == nil || !strings.Contains(out, "agent unreachable") {
			t.Fatalf("ambient pod without an agent: err=%v out=%s", err, out)
		}
	})
}

// lockedBuffer is a bytes.Buffer a child process writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
