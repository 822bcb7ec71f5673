package testcluster

import (
	"fmt"
	"strings"
)

// AddNetNS creates an extra network namespace of the cluster, named
// zt-<id>-x-<suffix>, with lo up and nothing else: a router or a gateway
// host joining the cluster to something outside it (another cluster's
// network, say). Wire it with IP; it is deleted with the cluster (and swept
// as a leftover by the next run, like every namespace of the cluster).
// suffix must be short: a namespace name is a file name, and it shows in
// `ip netns`.
func (c *Cluster) AddNetNS(suffix string) (*NetNS, error) {
	if suffix == "" || len(suffix) > 16 || strings.ContainsAny(suffix, "/ \t\n") {
		return nil, fmt.Errorf("testcluster: AddNetNS: bad suffix %q", suffix)
	}
	ns, err := c.newNetNS(nsPrefix(c.id) + "x-" + suffix)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.extras = append(c.extras, ns)
	c.mu.Unlock()
	return ns, nil
}

// IP runs ip(8) commands (e.g. "addr add 10.0.0.1/24 dev eth0") inside the
// namespace, in one `ip -batch`.
func (ns *NetNS) IP(cmds ...string) error {
	return ns.c.ipBatch(ns.name, cmds...)
}

// Sysctl sets a /proc/sys value inside the namespace ("net.ipv4.ip_forward",
// "1"); only the net.* tree is per namespace.
func (ns *NetNS) Sysctl(key, value string) error { return ns.sysctl(key, value) }
