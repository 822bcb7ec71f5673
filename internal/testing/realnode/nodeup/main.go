// Command nodeup is make node-up and make node-down: it brings the real
// single-node cluster of internal/testing/realnode up with the images of
// make images (and the pause, test-app and CoreDNS images) imported into
// its containerd, and leaves it running for a person to follow
// docs/install.md by hand; -down tears it down (safe to run twice).
//
// It installs nothing of ours: the install is the person's to do. The node
// is the one make test-node uses, so a make test-node run replaces it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/realnode"
)

func main() {
	down := flag.Bool("down", false, "tear the node down (everything node-up started and wrote)")
	k8sBin := flag.String("k8s-bin", "", "directory with etcd, kube-apiserver, kubectl (hack/k8s/build.sh k8s)")
	nodeBin := flag.String("node-bin", "", "directory with kubelet, kube-proxy, kube-scheduler, kube-controller-manager (hack/k8s/build.sh node)")
	helmBin := flag.String("helm-bin", "", "directory with helm (hack/k8s/build.sh helm), printed for PATH")
	cniBin := flag.String("cni-bin", "", "directory with the reference CNI plugins bridge, host-local, loopback")
	images := flag.String("images", "", "directory of our image archives (make images: bin/images)")
	testImages := flag.String("test-images", "", "directory of the pause, testapp and coredns archives (hack/images/testimage)")
	flag.Parse()
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+f+"\n", a...) }
	if *down {
		if err := realnode.Clean(logf); err != nil {
			fmt.Fprintln(os.Stderr, "node-down:", err)
			os.Exit(1)
		}
		fmt.Println("node down: processes, pods, mounts, iptables chains, the bridge and " + realnode.BaseDir + " removed; sysctls restored")
		return
	}
	for name, v := range map[string]string{"-k8s-bin": *k8sBin, "-node-bin": *nodeBin, "-helm-bin": *helmBin, "-cni-bin": *cniBin, "-images": *images, "-test-images": *testImages} {
		if v == "" {
			fmt.Fprintf(os.Stderr, "node-up: %s is required (make node-up sets it)\n", name)
			os.Exit(2)
		}
	}
	var archives []string
	for _, dir := range []string{*images, *testImages} {
		m, _ := filepath.Glob(filepath.Join(dir, "*.tar"))
		archives = append(archives, m...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n, err := realnode.Start(ctx, realnode.Options{K8sBin: *k8sBin, NodeBin: *nodeBin, CNIBin: *cniBin, Images: archives, Logf: logf, Detach: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-up:", err)
		os.Exit(1)
	}
	var names []string
	for _, a := range archives {
		names = append(names, filepath.Base(a))
	}
	fmt.Printf(`
The node %[1]s is up and stays up (make node-down tears it down; make test-node replaces it).
Images imported into its containerd: %[2]s

  export KUBECONFIG=%[3]s
  export PATH=%[4]s:%[5]s:$PATH     # kubectl and helm built for it
  kubectl get nodes

Its containerd is not the machine's default: give ctr (and crictl) its socket,
  ctr -a %[6]s -n k8s.io images ls
and zctl precheck finds it (and its CNI directories) from the running containerd.
Component logs: %[7]s. Follow docs/install.md from the repository root.
`, realnode.NodeName, strings.Join(names, ", "), n.Kubeconfig, *k8sBin, *helmBin, realnode.ContainerdSocket, n.LogDir())
}
