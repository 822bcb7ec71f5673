package controlplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/multicluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// mcServiceAndPod creates Service app/<name> (global when global) and one
// ready pod behind it at ip.
func mcServiceAndPod(ctx context.Context, t *testing.T, api *kubeapi.Server, name, ip string, global bool) {
	t.Helper()
	kc := api.Client()
	labels := map[string]string{}
	if global {
		labels[translate.LabelGlobal] = "true"
	}
	if _, err := kc.CoreV1().Services("app").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, Labels: labels},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := kc.CoreV1().Pods("app").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name + "-0", Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := kc.CoreV1().Pods("app").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// remoteSecret is what `istioctl create-remote-secret` writes into the
// primary's system namespace for cluster id: a bearer-token kubeconfig of
// a reader ServiceAccount of the remote cluster.
func remoteSecret(t *testing.T, remote *kubeapi.Server, id, token string) *corev1.Secret {
	t.Helper()
	kcfg := clientcmdapi.NewConfig()
	kcfg.Clusters[id] = &clientcmdapi.Cluster{Server: remote.Host(), CertificateAuthorityData: remote.CAPEM()}
	kcfg.AuthInfos[id] = &clientcmdapi.AuthInfo{Token: token}
	kcfg.Contexts[id] = &clientcmdapi.Context{Cluster: id, AuthInfo: id}
	kcfg.CurrentContext = id
	b, err := clientcmd.Write(*kcfg)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istio-remote-secret-" + id,
			Labels:      map[string]string{multicluster.SecretLabel: "true"},
			Annotations: map[string]string{"networking.istio.io/cluster": id}},
		Data: map[string][]byte{id: b},
	}
}

// TestMulticlusterRemoteSecret: two real API servers. Cluster east's
// control plane reads cluster west through a remote secret: west's
// endpoints of the global service appear in east's output with west's
// cluster id and network and the east-west gateway of west's network,
// west's endpoints of a local service do not; when west's credentials stop
// working its workloads stay for the stale bound and then go, east's own
// untouched; a rotated secret brings them back; deleting the secret
// removes them at once.
func TestMulticlusterRemoteSecret(t *testing.T) {
	east := kubeapi.Start(t, kubeapi.Options{})
	west := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := west.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		api *kubeapi.Server
		net string
	}{{east, "net-east"}, {west, "net-west"}} {
		if err := c.api.EnsureNamespace(ctx, "istio-system", map[string]string{translate.LabelNetwork: c.net}); err != nil {
			t.Fatal(err)
		}
		if err := c.api.EnsureNamespace(ctx, "app", nil); err != nil {
			t.Fatal(err)
		}
	}
	mcServiceAndPod(ctx, t, east, "global", "10.1.0.1", true)
	mcServiceAndPod(ctx, t, east, "local", "10.1.0.2", false)
	if _, err := west.Client().CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
		Labels: map[string]string{translate.LabelRegion: "eu", translate.LabelZone: "eu-west-1"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mcServiceAndPod(ctx, t, west, "global", "10.2.0.1", true)
	mcServiceAndPod(ctx, t, west, "local", "10.2.0.2", false)

	// West's east-west gateway, with the address its controller would
	// write into its status.
	gwc, err := gatewayclient.NewForConfig(west.Config())
	if err != nil {
		t.Fatal(err)
	}
	term, ipType := gatewayv1.TLSModeTerminate, gatewayv1.IPAddressType
	gw, err := gwc.GatewayV1().Gateways("istio-system").Create(ctx, &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istio-eastwestgateway",
			Labels: map[string]string{translate.LabelNetwork: "net-west"}},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: translate.EastWestClass, Listeners: []gatewayv1.Listener{{
			Name: "mesh", Port: 15008, Protocol: "HBONE", TLS: &gatewayv1.ListenerTLSConfig{Mode: &term,
				CertificateRefs: []gatewayv1.SecretObjectReference{{Name: "unused"}}},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gw.Status.Addresses = []gatewayv1.GatewayStatusAddress{{Type: &ipType, Value: "192.0.2.10"}}
	if _, err := gwc.GatewayV1().Gateways("istio-system").UpdateStatus(ctx, gw, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// West's reader account, as Istio's base chart makes istio-reader.
	wk := west.Client()
	if _, err := wk.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "services", "namespaces", "nodes"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"gateways"}, Verbs: []string{"get", "list", "watch"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := wk.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "istio-system", Name: "reader"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func() string {
		tok, err := west.CreateServiceAccountToken(ctx, "istio-system", "reader", "")
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ek := east.Client()
	secret, err := ek.CoreV1().Secrets("istio-system").Create(ctx, remoteSecret(t, west, "west", token()), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// East's control plane.
	clients, err := kube.NewClients(east.Config())
	if err != nil {
		t.Fatal(err)
	}
	src, err := kube.New(kube.Config{Clients: clients, Kinds: multicluster.RemoteKinds, Debounce: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const stale = 4 * time.Second
	obs, logs := observer.New(zap.WarnLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), obs))
	mc, err := multicluster.New(multicluster.Config{Kube: ek, Namespace: "istio-system", ClusterID: "east",
		StaleAfter: stale, ProbeInterval: 200 * time.Millisecond, Debounce: 10 * time.Millisecond, Log: log.Named("mc")})
	if err != nil {
		t.Fatal(err)
	}
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := caserver.NewNodeTokens(map[string]string{"node0": "tok0"})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := New(Config{Source: src, Remotes: mc, Translate: translate.Config{ClusterID: "east"}, CA: authority, Auth: auth,
		Debounce: time.Millisecond, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = cp.Run(rctx, lis); done <- struct{}{} }()
	go func() { _ = mc.Run(rctx); done <- struct{}{} }()
	t.Cleanup(func() { stop(); <-done; <-done })

	const remoteUID, localUID = "west//Pod/app/global-0", "east//Pod/app/global-0"
	workload := func(uid string) *workloadapi.Workload {
		r := cp.Result()
		if r == nil {
			return nil
		}
		a, _ := r.Addresses.Get(uid)
		return a.GetWorkload()
	}
	testkit.EventuallyErr(t, 60*time.Second, "west's global endpoint in east's output", func() error {
		w := workload(remoteUID)
		if w == nil {
			return fmt.Errorf("no %s; remote clusters %q", remoteUID, mc.Report())
		}
		gw := w.GetNetworkGateway()
		ip, _ := netip.AddrFromSlice(gw.GetAddress().GetAddress())
		if w.ClusterId != "west" || w.Network != "net-west" || ip.String() != "192.0.2.10" || gw.GetHboneMtlsPort() != 15008 {
			return fmt.Errorf("workload cluster %q network %q gateway %v", w.ClusterId, w.Network, gw)
		}
		if w.Services["app/global.app.svc.cluster.local"] == nil {
			return fmt.Errorf("services %v", w.Services)
		}
		if w.Locality.GetRegion() != "eu" || w.Locality.GetZone() != "eu-west-1" {
			return fmt.Errorf("locality %v, want its west Node's eu/eu-west-1", w.Locality)
		}
		return nil
	})
	if !mc.Ready() {
		t.Fatal("remote clusters not ready once west was read")
	}
	if workload("west//Pod/app/local-0") != nil {
		t.Fatal("west's endpoint of a local service is in east's output")
	}
	if w := workload(localUID); w == nil || w.Network != "net-east" || w.ClusterId != "east" {
		t.Fatalf("east's own workload = %v", w)
	}

	// A second secret naming west again (its kubeconfig unusable) and
	// east itself: both entries are ignored, west stays read through the
	// first secret.
	other := remoteSecret(t, west, "west", "not-a-token")
	other.Name = "istio-remote-secret-zz"
	other.Data["east"] = other.Data["west"]
	other.Data["north"] = []byte(`apiVersion: v1
kind: Config
clusters: [{name: "north", cluster: {server: "https://192.0.2.1:6443"}}]
users: [{name: "north", user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/true, interactiveMode: Never}}}]
contexts: [{name: "north", context: {cluster: "north", user: "north"}}]
current-context: "north"
`)
	if _, err := ek.CoreV1().Secrets("istio-system").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "both entries of the second secret ignored, with a warning", func() bool {
		return logs.FilterMessage("cluster already named by another remote secret; ignored").Len() == 1 &&
			logs.FilterMessage("remote secret names this cluster; ignored").Len() == 1
	})
	if r := mc.Report(); len(r) != 2 || r[0] != "north (secret istio-system/istio-remote-secret-zz): refused: kubeconfig user \"north\": exec credentials are not allowed" ||
		r[1] != "west (secret istio-system/istio-remote-secret-west): ok" {
		t.Fatalf("remote clusters with a duplicate, a self and a refused entry: %q", r)
	}
	if workload(remoteUID) == nil {
		t.Fatal("west's workloads went when a second secret named west")
	}
	if err := ek.CoreV1().Secrets("istio-system").Delete(ctx, other.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// West's credentials stop working (its reader account is deleted):
	// the workloads stay while the cluster is unreachable, then go.
	if err := wk.CoreV1().ServiceAccounts("istio-system").Delete(ctx, "reader", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "west unreachable", func() bool {
		return strings.Contains(strings.Join(mc.Report(), "\n"), "west (secret istio-system/istio-remote-secret-west): unreachable")
	})
	broke := time.Now()
	if workload(remoteUID) == nil {
		t.Fatal("west's workloads dropped as soon as its credentials failed; want them kept for the stale bound")
	}
	testkit.Eventually(t, 30*time.Second, "west's workloads dropped once stale", func() bool { return workload(remoteUID) == nil })
	if since := time.Since(broke); since < stale/2 {
		t.Fatalf("dropped %v after the failure was seen, want about %v", since, stale)
	}
	if workload(localUID) == nil {
		t.Fatal("east's own workload went with west's")
	}

	// Rotated credentials: west comes back.
	if err := west.EnsureServiceAccount(ctx, "istio-system", "reader"); err != nil {
		t.Fatal(err)
	}
	secret.Data = remoteSecret(t, west, "west", token()).Data
	if _, err := ek.CoreV1().Secrets("istio-system").Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, "west back after the secret's rotation", func() bool { return workload(remoteUID) != nil })

	// The secret goes: so do west's workloads, at once, not east's.
	if err := ek.CoreV1().Secrets("istio-system").Delete(ctx, secret.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	testkit.Eventually(t, 30*time.Second, "west's workloads gone with the secret", func() bool { return workload(remoteUID) == nil })
	if since := time.Since(deleted); since >= stale {
		t.Fatalf("west's workloads went %v after the secret, want well before the stale bound %v", since, stale)
	}
	if workload(localUID) == nil {
		t.Fatal("east's own workload went with west's secret")
	}
	if r := mc.Report(); len(r) != 0 {
		t.Fatalf("remote clusters after the secret went: %q", r)
	}
}
