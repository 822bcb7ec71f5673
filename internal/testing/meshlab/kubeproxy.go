package meshlab

import (
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

// kubeProxyChain is the nat chain holding the Service DNAT rules in every
// node's namespace.
const kubeProxyChain = "MESHLAB-SERVICES"

// KubeProxyRules returns the iptables-restore input (nat table) that makes
// Service ClusterIPs reachable for clients outside the mesh, as kube-proxy
// does: per service port, DNAT to a random ready endpoint. Pure; exported
// for tests.
func KubeProxyRules(objs []kube.Object) string {
	slices := map[string]*kube.EndpointSlice{}
	var svcs []*kube.Service
	for _, o := range objs {
		switch v := o.(type) {
		case *kube.Service:
			if v.ClusterIP.IsValid() {
				svcs = append(svcs, v)
			}
		case *kube.EndpointSlice:
			slices[v.Namespace+"/"+v.ServiceName] = v
		}
	}
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].ClusterIP.Less(svcs[j].ClusterIP) })
	var b strings.Builder
	fmt.Fprintf(&b, "*nat\n:%s - [0:0]\n", kubeProxyChain)
	for _, s := range svcs {
		es := slices[s.Namespace+"/"+s.Name]
		if es == nil {
			continue
		}
		for _, sp := range s.Ports {
			if sp.Protocol != "" && sp.Protocol != "TCP" {
				continue
			}
			port := 0
			for _, ep := range es.Ports {
				if ep.Name == sp.Name {
					port = ep.Port
				}
			}
			var ready []kube.Endpoint
			for _, e := range es.Endpoints {
				if e.Ready {
					ready = append(ready, e)
				}
			}
			if port == 0 || len(ready) == 0 {
				continue
			}
			for i, e := range ready {
				fmt.Fprintf(&b, "-A %s -d %s/32 -p tcp --dport %d", kubeProxyChain, s.ClusterIP, sp.Port)
				if left := len(ready) - i; left > 1 {
					fmt.Fprintf(&b, " -m statistic --mode random --probability %.5f", 1/float64(left))
				}
				fmt.Fprintf(&b, " -j DNAT --to-destination %s:%d\n", e.Address, port)
			}
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// SyncKubeProxy rewrites every node's Service DNAT rules from the cluster's
// current objects. Traffic from captured pods never reaches them: the
// in-pod rules hand it to the node proxy first.
func (m *Mesh) SyncKubeProxy() error {
	m.kpMu.Lock()
	defer m.kpMu.Unlock()
	rules := KubeProxyRules(m.Cluster.Objects())
	if rules == m.kpLast {
		return nil
	}
	for _, n := range m.Nodes {
		if err := m.nodeIPTables(n, rules); err != nil {
			return err
		}
	}
	m.kpLast = rules
	return nil
}

func (m *Mesh) nodeIPTables(n *MeshNode, rules string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// --noflush: the declared chain is flushed, the rest of the table (the
	// agent's host rules) kept.
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", n.NetNSName(), "iptables-restore", "--noflush", "-w")
	cmd.Stdin = strings.NewReader(rules)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("meshlab: kube-proxy rules on %s: %w: %s", n.Name, err, out)
	}
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		if _, err := n.Exec(ctx, "iptables", "-w", "-t", "nat", "-C", hook, "-j", kubeProxyChain); err == nil {
			continue
		}
		if _, err := n.Exec(ctx, "iptables", "-w", "-t", "nat", "-I", hook, "-j", kubeProxyChain); err != nil {
			return fmt.Errorf("meshlab: kube-proxy jump on %s: %w", n.Name, err)
		}
	}
	return nil
}
