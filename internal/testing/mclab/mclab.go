// Package mclab runs an ambient multi-network multicluster mesh on one
// machine for root tests: two clusters, each with its own real API server
// (kubeapi), its own control plane and node proxies (meshlab in Kubernetes
// mode), on two networks that only their east-west gateways join.
//
// Topology (addresses are per cluster; both clusters use testcluster's
// plan, so node and pod addresses overlap between them, as Istio allows
// across networks):
//
//	cluster i underlay 10.30.0.0/24 ── edge i (10.30.0.250) ── WAN 10.29.0.0/24 (edge i: 10.29.0.(1+i))
//
// Each cluster has an edge namespace: its router to the WAN and the host of
// its east-west gateway (cmd/waypoint --mode east-west), which listens on
// the edge's WAN address, like a LoadBalancer IP. Its Gateway (class
// istio-east-west, status address = the WAN address), pod (host network on
// Node "edge") and LoadBalancer Service are stored as the controller and
// kubelet would leave them. Nodes route only the WAN
// range to their edge; an edge routes only its own cluster's pod ranges and
// masquerades what it forwards onto the WAN. So a pod or node of one
// cluster can reach nothing of the other cluster but its gateway's WAN
// address, and every packet between the networks crosses the WAN bridge
// (CaptureWAN).
//
// The API servers listen on the test process's loopback; meshlab forwards
// both into every node (a control plane reads its own and, through a remote
// secret, the other). Everything is torn down by the TB's cleanups; a rerun
// after an aborted one deletes the leftovers (testcluster's naming).
package mclab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Address plan of the parts mclab adds to testcluster's.
const (
	// WANCIDR joins the edges; edge i is 10.29.0.(1+i).
	WANCIDR = "10.29.0.0/24"
	// EdgeUnderlayIP is every edge's address on its cluster's underlay.
	EdgeUnderlayIP = "10.30.0.250"
	// GatewayPort is the east-west gateway's HBONE port.
	GatewayPort = 15008
	// GatewayReadyPort and GatewayMetricsPort listen on every address of
	// the edge; GatewayAdminAddr on its loopback.
	GatewayReadyPort   = 15021
	GatewayMetricsPort = 15020
	GatewayAdminAddr   = "127.0.0.1:15000"
	// GatewayName is the east-west Gateway (namespace istio-system) and its
	// ServiceAccount.
	GatewayName = "eastwest"
)

// Options configures Start.
type Options struct {
	// Names of the two clusters (cluster ids); "east" and "west" when empty.
	Names [2]string
	// Networks of the two clusters; "net-<name>" when empty.
	Networks [2]string
	// Nodes per cluster; 0 means 1.
	Nodes int
	// BinDir holds prebuilt binaries (see meshlab.Options.BinDir); "" builds
	// them once for both clusters.
	BinDir string
	// LogLevel of every binary; "" means info.
	LogLevel string
}

// Lab is a running two-cluster mesh.
type Lab struct {
	tb       testkit.TB
	Clusters [2]*Cluster
	// WAN is the namespace holding bridge "wan0" between the edges.
	WAN  *testcluster.NetNS
	bins string
}

// Cluster is one cluster of the lab.
type Cluster struct {
	Name, Network string
	API           *kubeapi.Server
	*meshlab.Mesh
	// Edge is the router to the WAN and the gateway's host.
	Edge *testcluster.NetNS
	// GatewayIP is the east-west gateway's (WAN) address.
	GatewayIP netip.Addr
	// Gateway is the east-west gateway process, once StartGateway ran.
	Gateway *testcluster.Proc
	lab     *Lab
	index   int
}

// Start builds both clusters, the WAN and the edges, and starts both east-
// west gateways. It applies no remote secrets (see ApplyRemoteSecret).
func Start(tb testkit.TB, opts Options) (*Lab, error) {
	tb.Helper()
	if t, ok := tb.(testing.TB); ok {
		roottest.Require(t) // before the API servers: network namespaces
	}
	for i, def := range [2]string{"east", "west"} {
		if opts.Names[i] == "" {
			opts.Names[i] = def
		}
		if opts.Networks[i] == "" {
			opts.Networks[i] = "net-" + opts.Names[i]
		}
	}
	if opts.Nodes == 0 {
		opts.Nodes = 1
	}
	l := &Lab{tb: tb, bins: opts.BinDir}
	if l.bins == "" {
		l.bins = tb.TempDir()
		start := time.Now()
		if _, err := testkit.Build(l.bins, meshlab.BinZtunnel, meshlab.BinCNI, meshlab.BinCP, meshlab.BinWaypoint); err != nil {
			return nil, fmt.Errorf("mclab: %w", err)
		}
		tb.Logf("mclab: built the binaries in %v", time.Since(start).Round(time.Millisecond))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var apis [2]*kubeapi.Server
	for i := range apis {
		apis[i] = kubeapi.Start(tb, kubeapi.Options{})
		if err := apis[i].ApplyCRDs(ctx); err != nil {
			return nil, fmt.Errorf("mclab: %s: %w", opts.Names[i], err)
		}
	}
	rootCert, rootKey, err := writeRoot(tb.TempDir())
	if err != nil {
		return nil, err
	}
	for i := range l.Clusters {
		m, err := meshlab.Start(tb, meshlab.Options{
			Nodes: opts.Nodes, Name: opts.Names[i], BinDir: l.bins, LogLevel: opts.LogLevel,
			Kube: &meshlab.Kube{
				API: apis[i], ClusterID: opts.Names[i], Network: opts.Networks[i],
				RootCert: rootCert, RootKey: rootKey, Remote: []*kubeapi.Server{apis[1-i]},
			},
		})
		if err != nil {
			return nil, fmt.Errorf("mclab: cluster %s: %w", opts.Names[i], err)
		}
		l.Clusters[i] = &Cluster{Name: opts.Names[i], Network: opts.Networks[i], API: apis[i], Mesh: m, lab: l, index: i,
			GatewayIP: wanIP(i)}
	}
	if err := l.buildWAN(ctx); err != nil {
		return nil, err
	}
	for _, c := range l.Clusters {
		if err := c.StartGateway(ctx); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func wanIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 29, 0, byte(1 + i)}) }

// buildWAN creates the WAN namespace (owned by the first cluster) and each
// cluster's edge, and routes the nodes' WAN traffic to their edge.
func (l *Lab) buildWAN(ctx context.Context) error {
	wan, err := l.Clusters[0].AddNetNS("wan")
	if err != nil {
		return fmt.Errorf("mclab: %w", err)
	}
	l.WAN = wan
	if err := wan.IP("link add wan0 type bridge", "link set wan0 up"); err != nil {
		return fmt.Errorf("mclab: %w", err)
	}
	for _, k := range []string{"net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"} {
		if err := wan.Sysctl(k, "1"); err != nil {
			return err
		}
	}
	wanBits := netip.MustParsePrefix(WANCIDR).Bits()
	ulBits := netip.MustParsePrefix(testcluster.UnderlayCIDR).Bits()
	for i, c := range l.Clusters {
		edge, err := c.AddNetNS("edge")
		if err != nil {
			return fmt.Errorf("mclab: %w", err)
		}
		c.Edge = edge
		for _, kv := range [][2]string{
			{"net.ipv4.ip_forward", "1"},
			{"net.ipv6.conf.all.disable_ipv6", "1"},
			{"net.ipv6.conf.default.disable_ipv6", "1"},
			{"net.ipv4.conf.all.rp_filter", "0"},
			{"net.ipv4.conf.default.rp_filter", "0"},
		} {
			if err := edge.Sysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
		// The veths are born in the underlay and the WAN with their peers
		// in the edge: never in the machine's namespace.
		if err := c.Underlay().IP(
			"link add edge type veth peer name ul0 netns "+edge.NetNSName(),
			"link set edge master br0 up"); err != nil {
			return fmt.Errorf("mclab: %w", err)
		}
		wanVeth := fmt.Sprintf("c%d", i)
		if err := wan.IP(
			"link add "+wanVeth+" type veth peer name wan0 netns "+edge.NetNSName(),
			"link set "+wanVeth+" master wan0 up"); err != nil {
			return fmt.Errorf("mclab: %w", err)
		}
		cmds := []string{
			fmt.Sprintf("addr add %s/%d dev ul0", EdgeUnderlayIP, ulBits),
			"link set ul0 up",
			fmt.Sprintf("addr add %s/%d dev wan0", c.GatewayIP, wanBits),
			"link set wan0 up",
		}
		for _, n := range c.Cluster.Nodes() {
			cmds = append(cmds, fmt.Sprintf("route add %s via %s dev ul0", n.PodCIDR, n.UnderlayIP))
			if err := n.IP(fmt.Sprintf("route add %s via %s dev eth0", WANCIDR, EdgeUnderlayIP)); err != nil {
				return fmt.Errorf("mclab: %w", err)
			}
		}
		if err := edge.IP(cmds...); err != nil {
			return fmt.Errorf("mclab: %w", err)
		}
		// What the edge forwards onto the WAN leaves with the edge's WAN
		// address: the other side never sees (overlapping) node or pod
		// addresses, and answers come back to this edge.
		if _, err := edge.Exec(ctx, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan0", "-j", "MASQUERADE"); err != nil {
			return fmt.Errorf("mclab: %w", err)
		}
	}
	return nil
}

// CaptureWAN starts tcpdump on the WAN bridge: every packet between the
// two networks.
func (l *Lab) CaptureWAN(ctx context.Context, filter string) (*testcluster.Capture, error) {
	return l.WAN.CaptureBridge(ctx, "wan0", filter)
}

// Other returns the lab's other cluster.
func (c *Cluster) Other() *Cluster { return c.lab.Clusters[1-c.index] }

// writeRoot writes a self-signed root CA (the mesh's shared root) as
// root-cert.pem and root-key.pem into dir.
func writeRoot(dir string) (string, string, error) {
	certPEM, keyPEM, err := newRootPEM()
	if err != nil {
		return "", "", fmt.Errorf("mclab: root CA: %w", err)
	}
	cert, key := filepath.Join(dir, "root-cert.pem"), filepath.Join(dir, "root-key.pem")
	if err := os.WriteFile(cert, certPEM, 0o644); err != nil {
		return "", "", fmt.Errorf("mclab: %w", err)
	}
	if err := os.WriteFile(key, keyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("mclab: %w", err)
	}
	return cert, key, nil
}

// newRootPEM makes a root the way ztunnel-cp makes its own (ca.New without
// a root), so both control planes load the same kind of root they would
// generate.
func newRootPEM() ([]byte, []byte, error) {
	authority, err := ca.New(ca.Options{})
	if err != nil {
		return nil, nil, err
	}
	key, err := authority.RootKeyPEM()
	if err != nil {
		return nil, nil, err
	}
	return authority.RootPEM(), key, nil
}
