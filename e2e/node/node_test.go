package node

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/realnode"
)

// TestNodeDaemonSetsReady: the agent and node proxy DaemonSets (and the
// control plane) become Ready on the kubelet, and the agent chained our
// plugin into the CNI configuration the container runtime reads.
func TestNodeDaemonSetsReady(t *testing.T) {
	e := mesh(t)
	start := time.Now()
	e.waitMeshReady(t)
	t.Logf("mesh ready %v after the test started", time.Since(start).Round(time.Millisecond))

	path := filepath.Join(realnode.CNIConfDir, "10-"+realnode.NetworkName+".conflist")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("runtime's CNI config: %v", err)
	}
	var conf struct {
		Name    string `json:"name"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, data)
	}
	var types []string
	for _, p := range conf.Plugins {
		types = append(types, p.Type)
	}
	if len(types) < 2 || types[0] != "bridge" || types[len(types)-1] != "ztunnel-cni" {
		t.Fatalf("%s plugins %v, want bridge first and ztunnel-cni chained last", path, types)
	}
	if st, err := os.Stat(filepath.Join(realnode.CNIBinDir, "ztunnel-cni")); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("plugin binary in %s: %v", realnode.CNIBinDir, err)
	}
}

// TestNodeNewPodCaptured: a pod created in an ambient namespace gets the
// in-pod capture rules from the chain the runtime invokes (bridge, then our
// plugin, which hands the pod to the agent) before its app starts.
func TestNodeNewPodCaptured(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	e.namespace(t, "capture-amb", true)
	e.namespace(t, "capture-plain", false)
	amb := e.pod(t, "capture-amb", "app", nil, "pause")
	plain := e.pod(t, "capture-plain", "app", nil, "pause")

	rules := e.podIptables(t, amb)
	for _, want := range []string{"ISTIO_PRERT", "ISTIO_OUTPUT", "15001", "15006"} {
		if !strings.Contains(rules, want) {
			t.Errorf("ambient pod %s: no %q in its netns rules:\n%s", amb.Status.PodIP, want, rules)
		}
	}
	if r := e.podIptables(t, plain); strings.Contains(r, "ISTIO_") {
		t.Errorf("pod in a non-ambient namespace has capture rules:\n%s", r)
	}
}

// TestNodePodToPodHBONE: an ambient client reaches an ambient server
// through its ClusterIP Service, and a capture on the node's bridge sees the
// two pods talk only TLS on 15008: no plaintext, nothing on the app's port.
func TestNodePodToPodHBONE(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	const ns = "hbone"
	e.namespace(t, ns, true)
	srv := e.pod(t, ns, "srv", map[string]string{"app": "srv"}, "serve")
	cli := e.pod(t, ns, "cli", nil, "pause")
	ctx := testCtx(t, 3*time.Minute)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "srv", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "srv"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	svc, err := e.node.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	pcap := filepath.Join(t.TempDir(), "bridge.pcap")
	// Everything to or from the server pod on the bridge, whoever the peer.
	filter := fmt.Sprintf("tcp and host %s", srv.Status.PodIP)
	// On every host interface (the bridge and the pods' veths): on the
	// bridge device alone, frames switched between two ports showed up in
	// one run and not in the next.
	dump := exec.Command("tcpdump", "-i", "any", "-n", "-U", "-s", "0", "-w", pcap, filter)
	stderr, err := dump.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := dump.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	listening := make(chan struct{})
	var dumpLog strings.Builder // tcpdump's stderr, read only after Wait
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			dumpLog.WriteString(sc.Text() + "\n")
			if !once && strings.Contains(sc.Text(), "listening on") {
				close(listening)
				once = true
			}
		}
	}()
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		_ = dump.Process.Kill()
		t.Fatal("tcpdump did not start listening")
	}

	// The filter may be attached a moment after tcpdump says it listens.
	time.Sleep(time.Second)
	// The node proxy learns the new pods and Service through xDS; retry
	// until it routes.
	url := "http://" + svc.Spec.ClusterIP + "/"
	var body string
	waitUntil(t, 60*time.Second, func() error {
		var err error
		body, err = e.exec(ctx, ns, "cli", "/testapp", "get", "-timeout", "3s", url)
		return err
	})
	if !strings.Contains(body, "pod=srv ns=hbone") {
		t.Errorf("GET %s answered %q, want the server pod", url, body)
	}
	t.Logf("GET %s from %s: %s", url, cli.Status.PodIP, strings.TrimSpace(body))
	// By name, through the DNS the node proxy captures.
	name := "http://srv." + ns + ".svc.cluster.local/"
	if out, err := e.exec(ctx, ns, "cli", "/testapp", "get", "-timeout", "5s", name); err != nil || !strings.Contains(out, "pod=srv") {
		t.Errorf("GET %s: %v %q", name, err, out)
	}
	time.Sleep(time.Second)
	_ = dump.Process.Signal(syscall.SIGINT)
	<-stderrDone
	_ = dump.Wait()

	data, err := os.ReadFile(pcap)
	if err != nil {
		t.Fatal(err)
	}
	for _, plain := range []string{"pod=srv", "GET / HTTP"} {
		if bytes.Contains(data, []byte(plain)) {
			t.Errorf("plaintext %q to or from the server pod on the host's interfaces", plain)
		}
	}
	count := func(f string) int {
		out, err := exec.Command("tcpdump", "-r", pcap, "-n", f).Output()
		if err != nil {
			t.Fatalf("tcpdump -r %s: %v", f, err)
		}
		return len(strings.Split(strings.TrimSpace(string(out)), "\n")) - boolInt(strings.TrimSpace(string(out)) == "")
	}
	all, hbone := count("tcp"), count("tcp port 15008")
	hello := count("tcp dst port 15008 and tcp[((tcp[12:1] & 0xf0) >> 2):1] = 0x16")
	fromCli := count("tcp and src host " + cli.Status.PodIP)
	t.Logf("bridge capture: %d packets to/from the server pod, %d on 15008, %d from the client pod, %d TLS handshake records to 15008", all, hbone, fromCli, hello)
	if hbone == 0 || all != hbone {
		t.Errorf("%d of %d packets to/from the server pod on 15008, want all and some", hbone, all)
	}
	if hello == 0 {
		t.Errorf("no TLS handshake to 15008 seen")
	}
	if t.Failed() {
		out, _ := exec.Command("tcpdump", "-r", pcap, "-n").CombinedOutput()
		t.Logf("tcpdump -i any %s:\n%s\ncapture:\n%s", filter, dumpLog.String(), out)
		logs, _ := e.node.Kubectl(ctx, "logs", "-n", systemNS, "-l", "app=ztunnel", "--tail=40")
		t.Logf("node proxy log:\n%s", logs)
		logs, _ = e.node.Kubectl(ctx, "logs", "-n", ns, "srv")
		t.Logf("server log:\n%s", logs)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
