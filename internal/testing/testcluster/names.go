package testcluster

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
)

// Address plan. Every range lives only inside the cluster's namespaces, so it
// cannot clash with the machine's routes; the ranges are still chosen apart
// from the usual defaults (this machine's 192.0.2.0/24, Docker's 172.17/16,
// kind's 10.244/16 pods and 10.96/12 services) so addresses in logs are never
// ambiguous.
const (
	// UnderlayCIDR is the node network: node i has 10.30.0.(10+i).
	UnderlayCIDR = "10.30.0.0/24"
	// PodCIDRs holds one /24 per node: node i owns 10.31.i.0/24, its bridge
	// (the pods' gateway) is 10.31.i.1 and its j-th pod is 10.31.i.(10+j).
	PodCIDRs = "10.31.0.0/16"
	// ServiceCIDR is where ClusterIPs come from: the k-th service gets
	// 10.32.0.0 + 10 + k.
	ServiceCIDR = "10.32.0.0/16"

	// MaxNodes and MaxPodsPerNode keep every derived address inside its
	// range.
	MaxNodes       = 200
	MaxPodsPerNode = 240

	hostOffset = 10 // first derived host number in each range
)

// NodeUnderlayIP is node i's InternalIP (Node.UnderlayIP), known before the
// cluster exists: a process started with a node's address in its
// configuration needs it.
func NodeUnderlayIP(i int) netip.Addr { return underlayIP(i) }

func underlayIP(node int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 30, 0, byte(hostOffset + node)})
}

func podCIDR(node int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 31, byte(node), 0}), 24)
}

func podGateway(node int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 31, byte(node), 1})
}

func podIP(node, pod int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 31, byte(node), byte(hostOffset + pod)})
}

func serviceIP(k int) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], 10<<24|32<<16+uint32(hostOffset+k))
	return netip.AddrFrom4(b)
}

// Names. Network namespaces are named zt-<id>-<suffix> where id is
// "<slug>-<hash>": slug is the test name made file-name safe and cut to
// slugLen bytes (for people reading `ip netns`), hash is 6 hex digits of the
// package directory, the full test name and Options.Name (for uniqueness:
// tests of different packages run in parallel and may share a name). The same
// test in the same package gets the same names on every run, which is what
// lets New delete an aborted run's leftovers. Suffixes come from indexes:
// "ul" (underlay), "n<i>" (node i), "n<i>-p<j>" (pod j of node i).
//
// Interface names (≤ 15 bytes) never carry the id: every link lives inside a
// cluster namespace, so fixed names cannot collide: "br0" and "n<i>" in the
// underlay, "eth0" and "cni0" in a node, "eth0" in a pod.
const slugLen = 24

func clusterID(pkgDir, testName, name string) string {
	var slug strings.Builder
	dash := false
	for _, r := range testName {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		switch {
		case ok:
			slug.WriteRune(r)
			dash = false
		case !dash && slug.Len() > 0:
			slug.WriteByte('-')
			dash = true
		}
		if slug.Len() >= slugLen {
			break
		}
	}
	s := strings.TrimRight(slug.String(), "-")
	if s == "" {
		s = "t"
	}
	sum := sha256.Sum256([]byte(pkgDir + "\x00" + testName + "\x00" + name))
	return s + "-" + hex.EncodeToString(sum[:3])
}

func nsPrefix(id string) string { return "zt-" + id + "-" }

func underlayNS(id string) string    { return nsPrefix(id) + "ul" }
func nodeNS(id string, i int) string { return fmt.Sprintf("%sn%d", nsPrefix(id), i) }
func podNS(id string, i, j int) string {
	return fmt.Sprintf("%sn%d-p%d", nsPrefix(id), i, j)
}

// nodeName is the Kubernetes node name (spec.nodeName, ztunnel's NODE_NAME).
func nodeName(i int) string { return fmt.Sprintf("node%d", i) }

// uid derives a stable, UUID-shaped Kubernetes UID for an object of this
// cluster, so YAML and logs are identical across reruns.
func uid(id, kind, namespace, name string) string {
	sum := sha256.Sum256([]byte(id + "\x00" + kind + "\x00" + namespace + "\x00" + name))
	sum[6] = sum[6]&0x0f | 0x50 // version 5 layout, as a name-based UUID
	sum[8] = sum[8]&0x3f | 0x80
	h := hex.EncodeToString(sum[:16])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
