package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/cni/runtimecfg"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/bootstrap"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func byCheck(cs []checkResult) map[string]checkResult {
	m := map[string]checkResult{}
	for _, c := range cs {
		m[c.Check] = c
	}
	return m
}

// TestPrecheckLocalFake runs the local checks against a fake host: the
// container runtime's config naming the CNI dirs, /proc and /lib/modules,
// and fake binaries.
func TestPrecheckLocalFake(t *testing.T) {
	dir := t.TempDir()
	cni, proc, mods := filepath.Join(dir, "net.d"), filepath.Join(dir, "proc"), filepath.Join(dir, "modules")
	write(t, filepath.Join(dir, "etc/containerd/config.toml"), `version = 2
[grpc]
  address = "/run/k8s/containerd.sock"
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/bin"
  conf_dir = "/net.d"
`)
	have := map[string]bool{"iptables-nft-restore": true}
	p := nodeProbe{runtime: runtimecfg.Options{Root: dir, Proc: proc}, proc: proc, modules: mods,
		look: func(b string) (string, error) {
			if have[b] {
				return "/sbin/" + b, nil
			}
			return "", exec.ErrNotFound
		},
		mode:    func() rules.Mode { return rules.ModeNFT },
		version: func(string) string { t.Error("version asked with a detected mode"); return "" },
	}
	got := byCheck(p.localChecks())
	want := map[string]string{"container runtime": checkOK, "CNI bin dir": checkWarn,
		"CNI config": checkFail, "iptables backend": checkOK, "iptables-nft-restore": checkOK,
		"ip6tables-nft-restore": checkWarn, "REDIRECT target": checkWarn, "TPROXY target": checkWarn,
		"SO_REUSEPORT": checkOK, "tcp_migrate_req": checkWarn}
	for name, status := range want {
		if c, ok := got[name]; !ok || c.Status != status || (status != checkOK && c.Fix == "") {
			t.Errorf("%s: %+v, want %s with a fix", name, c, status)
		}
	}
	if len(got) != len(want) {
		t.Errorf("checks %v", got)
	}
	if !strings.Contains(got["iptables backend"].Detail, "nft") {
		t.Errorf("backend: %+v", got["iptables backend"])
	}
	if d := got["container runtime"].Detail; !strings.Contains(d, "conf dir /net.d") || !strings.Contains(d, "ctr -a /run/k8s/containerd.sock") {
		t.Errorf("container runtime: %s", d)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}

	// The runtime's file: the lexically first that parses (a broken .json
	// first, then a single-plugin .conf before a .conflist).
	write(t, filepath.Join(cni, "05-broken.json"), "{not json")
	write(t, filepath.Join(cni, "10-net.conf"), `{"cniVersion":"1.0.0","name":"net","type":"bridge"}`)
	write(t, filepath.Join(cni, "20-other.conflist"), `{"cniVersion":"1.0.0","name":"o","plugins":[{"type":"ptp"}]}`)
	write(t, filepath.Join(proc, "net", "ip_tables_targets"), "MARK\nREDIRECT\nCONNMARK\n")
	write(t, filepath.Join(proc, "sys", "net", "ipv4", "tcp_migrate_req"), "0\n")
	write(t, filepath.Join(mods, "modules.dep"), "kernel/net/netfilter/xt_TPROXY.ko.zst: kernel/net/ipv6/netfilter/nf_tproxy_ipv6.ko.zst\n")
	have["ip6tables-nft-restore"] = true
	got = byCheck(p.localChecks())
	for _, c := range got {
		if c.Status != checkOK {
			t.Errorf("%s: %+v, want OK", c.Check, c)
		}
	}
	if d := got["CNI config"].Detail; !strings.Contains(d, filepath.Join(cni, "10-net.conf")) || strings.Contains(d, "already chained") {
		t.Errorf("CNI config: %s", d)
	}
	if d := got["TPROXY target"].Detail; !strings.Contains(d, "xt_TPROXY is available") {
		t.Errorf("TPROXY from modules.dep: %s", d)
	}
	// After the install the plugin must be in both directories.
	p.after = true
	if got := byCheck(p.localChecks()); got["CNI config"].Status != checkFail || got["CNI bin dir"].Status != checkFail {
		t.Errorf("after install, nothing installed: %+v %+v", got["CNI config"], got["CNI bin dir"])
	}
	write(t, filepath.Join(cni, "01-ours.conflist"), `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"ztunnel-cni"}]}`)
	write(t, filepath.Join(dir, "bin", "ztunnel-cni"), "plugin")
	got = byCheck(p.localChecks())
	if d := got["CNI config"].Detail; got["CNI config"].Status != checkOK || !strings.Contains(d, "01-ours.conflist") || !strings.Contains(d, "ztunnel-cni is chained") {
		t.Errorf("chained: %+v", got["CNI config"])
	}
	if got["CNI bin dir"].Status != checkOK {
		t.Errorf("installed: %+v", got["CNI bin dir"])
	}
	p.after = false
	// A flag naming another conf dir than the runtime's WARNs.
	p.cniDir = "/etc/cni/net.d"
	if c, _, _ := p.runtimeCheck(); c.Status != checkWarn || !strings.Contains(c.Detail, "conf dir /etc/cni/net.d, which the runtime does not use") {
		t.Errorf("flag vs runtime: %+v", c)
	}
	p.cniDir = ""
	// No runtime: FAIL on a node, WARN when a cluster is checked from elsewhere.
	p.runtime.Root = t.TempDir()
	if c, _, _ := p.runtimeCheck(); c.Status != checkFail || !strings.Contains(c.Detail, "/etc/containerd/config.toml") || c.Fix == "" {
		t.Errorf("no runtime: %+v", c)
	}
	p.offNode = true
	if c, _, _ := p.runtimeCheck(); c.Status != checkWarn {
		t.Errorf("no runtime, cluster checked: %+v", c)
	}
	p.offNode, p.runtime.Root = false, dir

	// A required target that is neither registered nor a module FAILs.
	write(t, filepath.Join(proc, "net", "ip_tables_targets"), "MARK\n")
	if c := p.targetCheck("REDIRECT", "xt_REDIRECT", checkFail, "x"); c.Status != checkFail || c.Fix == "" {
		t.Errorf("REDIRECT missing: %+v", c)
	}
	delete(have, "iptables-nft-restore")
	if c := byCheck(p.localChecks())["iptables-nft-restore"]; c.Status != checkFail {
		t.Errorf("no iptables-restore: %+v", c)
	}
	// Default mode names the plain binaries and the variant iptables is.
	p.mode = func() rules.Mode { return rules.ModeDefault }
	p.version = func(string) string { return "iptables v1.8.9 (legacy)" }
	if got := byCheck(p.localChecks()); got["iptables-restore"].Status != checkFail || !strings.Contains(got["iptables backend"].Detail, "(legacy)") {
		t.Errorf("default mode: %+v", got)
	}
}

// TestPrecheckRealMachine runs zctl precheck on this machine with a fake
// CNI dir: each check answers, and the kernel's answers match what the
// test sees itself.
func TestPrecheckRealMachine(t *testing.T) {
	cni := t.TempDir()
	write(t, filepath.Join(cni, "10-net.conflist"), `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}`)
	var out bytes.Buffer
	err := run([]string{"precheck", "--cni-conf-dir", cni, "-o", "json"}, &out, &out)
	var r precheckReport
	if jerr := json.Unmarshal(out.Bytes(), &r); jerr != nil {
		t.Fatalf("%v %v\n%s", err, jerr, out.String())
	}
	host, _ := os.Hostname()
	if r.Node != host || len(r.Checks) < 9 || r.Phase != "before install" {
		t.Errorf("report: %+v", r)
	}
	failed := false
	for _, c := range r.Checks {
		switch c.Status {
		case checkOK:
		case checkWarn, checkFail:
			failed = failed || c.Status == checkFail
			if c.Fix == "" {
				t.Errorf("%s: %s without a fix", c.Check, c.Status)
			}
		default:
			t.Errorf("%s: status %q", c.Check, c.Status)
		}
	}
	if failed != errors.Is(err, errChecksFailed) {
		t.Errorf("exit error %v with a FAIL: %v", err, failed)
	}
	got := byCheck(r.Checks)
	if got["CNI config"].Status != checkOK || got["SO_REUSEPORT"].Status != checkOK || got["container runtime"].Status == "" {
		t.Errorf("CNI config / SO_REUSEPORT: %+v", got)
	}
	_, serr := os.Stat("/proc/sys/net/ipv4/tcp_migrate_req")
	if (serr == nil) != (got["tcp_migrate_req"].Status == checkOK) {
		t.Errorf("tcp_migrate_req %+v, stat %v", got["tcp_migrate_req"], serr)
	}
	if b, err := os.ReadFile("/proc/net/ip_tables_targets"); err == nil && hasLine(string(b), "TPROXY") && got["TPROXY target"].Status != checkOK {
		t.Errorf("TPROXY is registered: %+v", got["TPROXY target"])
	}
	if _, err := exec.LookPath("iptables-restore"); err == nil && got["iptables-restore"].Status == checkFail && got["iptables backend"].Detail[:7] == "default" {
		t.Errorf("iptables-restore is on PATH: %+v", got["iptables-restore"])
	}
	out.Reset()
	if err := run([]string{"precheck", "--cni-conf-dir", filepath.Join(cni, "nope")}, &out, &out); !errors.Is(err, errChecksFailed) ||
		!strings.Contains(out.String(), "# node: "+host) {
		t.Errorf("missing CNI dir: %v\n%s", err, out.String())
	}
}

// TestPrecheckCluster runs the cluster checks against a real API server:
// first bare (CRDs, Secret and ConfigMap missing), then with everything.
func TestPrecheckCluster(t *testing.T) {
	if rootConfigMap != bootstrap.RootConfigMapName || rootCertKey != bootstrap.RootConfigMapKey {
		t.Fatalf("root ConfigMap %s/%s, ztunnel-cp's %s/%s", rootConfigMap, rootCertKey, bootstrap.RootConfigMapName, bootstrap.RootConfigMapKey)
	}
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cni := t.TempDir()
	write(t, filepath.Join(cni, "10-net.conflist"), `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}`)
	precheckPhase := func(after bool) (map[string]checkResult, string, error) {
		var out bytes.Buffer
		_, checks, err := clusterChecks(api.Kubeconfig(), "mesh", "ca", after)
		if err != nil {
			t.Fatal(err)
		}
		args := []string{"precheck", "--cni-conf-dir", cni, "--cni-bin-dir", cni, "--kubeconfig", api.Kubeconfig(), "--namespace", "mesh", "--ca-secret", "ca"}
		if after {
			args = append(args, "--after-install")
		}
		rerr := run(args, &out, &out)
		return byCheck(checks), out.String(), rerr
	}
	precheck := func() (map[string]checkResult, string, error) { return precheckPhase(true) }
	got, out, err := precheck()
	if !errors.Is(err, errChecksFailed) || !strings.Contains(out, "# cluster: "+api.Host()) {
		t.Errorf("bare cluster: %v\n%s", err, out)
	}
	for name, status := range map[string]string{
		"API gateway.networking.k8s.io/v1": checkFail, "API networking.istio.io/v1": checkFail, "API security.istio.io/v1": checkFail,
		"API v1": checkOK, "CA Secret mesh/ca": checkFail, "root ConfigMap mesh/istio-ca-root-cert": checkFail,
		"node agent mesh/ztunnel-cni": checkFail, "node proxy mesh/ztunnel": checkFail,
	} {
		if c := got[name]; c.Status != status {
			t.Errorf("bare %s: %+v, want %s", name, c, status)
		}
	}
	// Before the install, the CRDs helm install adds are no failure; the
	// Gateway API's (installed first, by the user) and the CA Secret are.
	before, _, _ := precheckPhase(false)
	for name, status := range map[string]string{
		"API gateway.networking.k8s.io/v1": checkFail, "API networking.istio.io/v1": checkOK, "API security.istio.io/v1": checkOK,
		"CA Secret mesh/ca": checkFail, "Kubernetes version": checkOK,
	} {
		if c := before[name]; c.Status != status {
			t.Errorf("before install %s: %+v, want %s", name, c, status)
		}
	}
	for _, name := range []string{"root ConfigMap mesh/istio-ca-root-cert", "node agent mesh/ztunnel-cni"} {
		if c, ok := before[name]; ok {
			t.Errorf("before install, %s is checked: %+v", name, c)
		}
	}
	if d := before["API networking.istio.io/v1"].Detail; !strings.Contains(d, "helm install adds them") {
		t.Errorf("istio CRDs before install: %s", d)
	}
	if d := got["API gateway.networking.k8s.io/v1"].Detail; !strings.Contains(d, "gateways") || !strings.Contains(d, "gatewayclasses") {
		t.Errorf("gateway detail: %s", d)
	}

	if err := api.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	kc := api.Client()
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mesh"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	root := "-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n"
	if _, err := kc.CoreV1().Secrets("mesh").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ca"},
		Data: map[string][]byte{"root-cert.pem": []byte(root), "root-key.pem": []byte("key")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: rootConfigMap}, Data: map[string]string{rootCertKey: "another root"}}
	if _, err := kc.CoreV1().ConfigMaps("mesh").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := precheck(); got["root ConfigMap mesh/istio-ca-root-cert"].Status != checkFail {
		t.Errorf("a ConfigMap with another root: %+v", got["root ConfigMap mesh/istio-ca-root-cert"])
	}
	cm.Data[rootCertKey] = root
	if _, err := kc.CoreV1().ConfigMaps("mesh").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, out, _ = precheck()
	for _, c := range got {
		if c.Status != checkOK && !strings.HasPrefix(c.Check, "node ") {
			t.Errorf("complete cluster %s: %+v\n%s", c.Check, c, out)
		}
	}

	// The DaemonSets: one whose pods are not all Ready FAILs, naming them.
	ds := func(name string, ready int32) {
		t.Helper()
		d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "mesh"}, Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}}
		d, err := kc.AppsV1().DaemonSets("mesh").Create(ctx, d, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		d.Status = appsv1.DaemonSetStatus{DesiredNumberScheduled: 1, CurrentNumberScheduled: 1, NumberReady: ready}
		if _, err := kc.AppsV1().DaemonSets("mesh").UpdateStatus(ctx, d, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name + "-abc", Namespace: "mesh", Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		if _, err := kc.CoreV1().Pods("mesh").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ds("ztunnel-cni", 0)
	ds("ztunnel", 1)
	got, out, _ = precheck()
	if c := got["node agent mesh/ztunnel-cni"]; c.Status != checkFail || !strings.Contains(c.Detail, "0/1 Ready; not Ready: ztunnel-cni-abc on node1") ||
		!strings.Contains(c.Fix, "cni.cniBinDir") {
		t.Errorf("agent not Ready: %+v\n%s", c, out)
	}
	if c := got["node proxy mesh/ztunnel"]; c.Status != checkOK {
		t.Errorf("node proxy Ready: %+v", c)
	}
}
