package realnode

import (
	"fmt"
	"strings"
)

// Fixed names, addresses and ports of the node, distinct from the netns
// cluster's (10.30-10.32/16, zt-* bridges) and the API-server tests'
// (loopback, free ports). Fixed so a later run finds a killed run's state.
const (
	// BaseDir holds everything on disk: PKI, etcd, containerd's root,
	// the kubelet's root, CNI binaries and configuration, logs.
	BaseDir = "/var/lib/ztg-node"
	// RunDir holds sockets and containerd's state.
	RunDir = "/run/ztg-node"
	// NodeName is the Node object's name.
	NodeName = "ztg-node"
	// Bridge is the reference bridge plugin's bridge.
	Bridge = "ztgnode0"
	// PodCIDR is the primary network's subnet (host-local).
	PodCIDR = "10.233.0.0/24"
	// ServiceCIDR is the ClusterIP range; KubernetesServiceIP is its first.
	ServiceCIDR         = "10.234.0.0/16"
	KubernetesServiceIP = "10.234.0.1"
	// NetworkName is the primary CNI network's name.
	NetworkName = "ztg-node"

	APIServerPort    = 16443
	etcdClientPort   = 23790
	etcdPeerPort     = 23800
	kubeletPort      = 10350
	kubeletHealthz   = 10348
	proxyMetrics     = 10349
	proxyHealthz     = 10356
	kcmPort          = 10357
	schedulerPort    = 10359
	containerdSocket = RunDir + "/containerd.sock"
	ctrNamespace     = "k8s.io"

	// PauseImage, TestAppImage and CoreDNSImage are the references
	// hack/images/testimage writes (imported, never pulled).
	PauseImage   = "localhost/ztg-node/pause:test"
	TestAppImage = "localhost/ztg-node/testapp:test"
	CoreDNSImage = "localhost/ztg-node/coredns:test"
)

// Directories under BaseDir.
var (
	CNIBinDir       = BaseDir + "/cni/bin"
	CNIConfDir      = BaseDir + "/cni/net.d"
	cniIPAMDir      = BaseDir + "/cni/ipam"
	kubeletDir      = BaseDir + "/kubelet"
	podLogsDir      = "/tmp/ztg-node-logs/pods" // kept with logDir
	pkiDir          = BaseDir + "/pki"
	logDir          = "/tmp/ztg-node-logs" // kept after teardown; emptied by the next Start
	etcdDir         = BaseDir + "/etcd"
	ctrRoot         = BaseDir + "/containerd"
	ctrState        = RunDir + "/containerd"
	pidFile         = BaseDir + "/pids"
	sysctlFile      = BaseDir + "/sysctl.orig"
	createdDirsFile = BaseDir + "/created-dirs"
)

// hostDirs are host paths the chart mounts with DirectoryOrCreate; the
// harness removes the ones that did not exist before it ran.
// /var/log/containers holds the kubelet's links to the pod logs
// (podLogsDir is ours; the links' directory is fixed).
var hostDirs = []string{"/run/ztunnel", "/run/ztunnel-cni", "/var/log/containers"}

// sysctls are the host settings the kubelet, kube-proxy and the bridge
// plugin change; their values before the first run are restored on teardown.
var sysctls = []string{
	"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops",
	"net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
	"net/netfilter/nf_conntrack_max",
}

func containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = %[3]q
[ttrpc]
  address = "%[3]s.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[4]q
  # No CAP_SYS_RESOURCE on these machines: a sandbox's -998 cannot be set.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[5]q
    conf_dir = %[6]q
    max_conf_num = 1
`, ctrRoot, ctrState, containerdSocket, PauseImage, CNIBinDir, CNIConfDir)
}

// cniConflist is the primary network: bridge + host-local, as a cluster
// without an overlay would configure it. Our agent chains its plugin into
// this file.
func cniConflist() string {
	gw := strings.TrimSuffix(PodCIDR, "0/24") + "1"
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    }
  ]
}
`, NetworkName, Bridge, PodCIDR, gw, cniIPAMDir)
}

func kubeletConfig(clusterDNS string) string {
	dns := ""
	if clusterDNS != "" {
		dns = fmt.Sprintf("clusterDNS: [%q]\n", clusterDNS)
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# These VMs have cgroup v1 only; kubelet >= 1.35 refuses it unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
# No CAP_SYS_RESOURCE: the kubelet's own -999 cannot be set.
oomScoreAdj: 0
containerRuntimeEndpoint: unix://%[1]s
port: %[2]d
readOnlyPort: 0
healthzPort: %[3]d
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[4]q}
authorization: {mode: Webhook}
%[5]sclusterDomain: cluster.local
# Imported images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 87600h
evictionHard: {"memory.available": "100Mi", "nodefs.available": "1%%", "imagefs.available": "1%%", "nodefs.inodesFree": "1%%"}
serializeImagePulls: false
maxPods: 60
podCIDR: %[6]q
protectKernelDefaults: false
failSwapOn: false
tlsCertFile: %[7]q
tlsPrivateKeyFile: %[8]q
rotateCertificates: false
serverTLSBootstrap: false
staticPodPath: ""
podLogsDir: %[9]q
`, containerdSocket, kubeletPort, kubeletHealthz, pkiDir+"/ca.crt", dns, PodCIDR, pkiDir+"/kubelet-serving.crt", pkiDir+"/kubelet-serving.key", podLogsDir)
}

func kubeProxyConfig(kubeconfig string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: %q}
hostnameOverride: %q
clusterCIDR: %q
oomScoreAdj: 0
# Leave the host's conntrack sysctls alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
metricsBindAddress: 127.0.0.1:%d
healthzBindAddress: 127.0.0.1:%d
`, kubeconfig, NodeName, PodCIDR, proxyMetrics, proxyHealthz)
}
