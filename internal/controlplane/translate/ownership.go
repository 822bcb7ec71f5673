package translate

import (
	"fmt"
	"net/netip"
	"slices"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
)

// Address ownership (issue 24). A pod's IP belongs to its pod, a node's
// addresses (and so every host-network pod's) to the cluster, a Kubernetes
// Service's ClusterIPs and load-balancer IPs to the Service's namespace.
// A ServiceEntry is a tenant's statement about addresses outside that
// set: an address or range in spec.addresses that names what another owns
// would let the tenant take the owner's traffic (to its waypoint, or into
// a black hole), so it is refused, for that address only; the rest of the
// ServiceEntry still works. The refusals go into the ServiceEntry's
// status (Result.Policies, kind ServiceEntry), hence the config dump and
// zctl analyze, which read the same status.
//
// The rules, checked in order for each spec.addresses entry:
//
//  1. A range of length 0 (0.0.0.0/0, ::/0) is always refused: it names
//     every address, which no tenant owns.
//  2. An address or range that holds (or is) a node address, a pod IP of
//     another namespace (host-network pods count as the node), or a
//     ClusterIP / load-balancer IP of another namespace's Service is
//     refused. An exact address equal to a pod IP of the entry's own
//     namespace is refused too: that pod is a workload, reached as itself
//     (a range merely containing such a pod is the namespace's own
//     business; node proxies never let a range take a workload's address).
//  3. An address or range overlapping an accepted one of another
//     namespace's older ServiceEntry that some namespace sees together
//     with this one (exportTo) is refused: the oldest
//     creationTimestamp wins, then namespace/name only between equal
//     timestamps (as istiod orders conflicting config). A tenant cannot
//     win by picking a name, only by having been there first, and being
//     first never beats rule 2.
//
// Networks are not told apart: an address owned on any network is owned
// (refusing is the safe error).

// owned indexes the addresses rule 2 protects.
type owned struct {
	// ips: owner "kind ns/name" and its namespace ("" = everybody's: a
	// node address).
	ips map[netip.Addr]owner
	// sorted keys of ips, for range checks (binary search).
	sorted []netip.Addr
}

type owner struct {
	what string // "pod ns/name", "node name", "Service ns/name"
	ns   string // "" for a node address: owned by nobody's namespace
	// workload: a pod or WorkloadEntry, reached as itself, which no
	// ServiceEntry may name exactly (not even its own namespace's).
	workload bool
}

// buildOwned collects pod, node and Service addresses of t.objs.
func (t *translator) buildOwned() *owned {
	o := &owned{ips: map[netip.Addr]owner{}}
	add := func(ip netip.Addr, w owner) {
		ip = ip.Unmap()
		if cur, ok := o.ips[ip]; ok && cur.ns == "" {
			return // a node address stays everybody's
		}
		o.ips[ip] = w
	}
	for _, n := range t.objs.Nodes {
		for _, ip := range nodeIPs(n) {
			add(ip, owner{what: "node " + n.Name})
		}
	}
	for _, p := range t.objs.Pods {
		for _, ip := range podIPs(p) {
			if p.Spec.HostNetwork {
				add(ip, owner{what: "node " + p.Spec.NodeName})
			} else {
				add(ip, owner{what: "pod " + p.Namespace + "/" + p.Name, ns: p.Namespace, workload: true})
			}
		}
	}
	for _, we := range t.objs.WorkloadEntries {
		if ip, err := netip.ParseAddr(we.Spec.Address); err == nil {
			add(ip, owner{what: "WorkloadEntry " + we.Namespace + "/" + we.Name, ns: we.Namespace, workload: true})
		}
	}
	for _, s := range t.objs.Services {
		if s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		for _, ip := range serviceVIPs(s) {
			add(ip, owner{what: "Service " + s.Namespace + "/" + s.Name, ns: s.Namespace})
		}
	}
	o.sorted = make([]netip.Addr, 0, len(o.ips))
	for ip := range o.ips {
		o.sorted = append(o.sorted, ip)
	}
	slices.SortFunc(o.sorted, netip.Addr.Compare)
	return o
}

// ownerIn returns the first owned address in p that ns may not claim, and
// its owner. exact is true when p is a single address.
func (o *owned) ownerIn(p netip.Prefix, ns string) (netip.Addr, owner, bool) {
	exact := p.Bits() == p.Addr().BitLen()
	if exact {
		if w, ok := o.ips[p.Addr()]; ok && (w.ns != ns || w.workload) {
			return p.Addr(), w, true
		}
		return netip.Addr{}, owner{}, false
	}
	// The addresses inside p form one run of the sorted list.
	first := p.Masked().Addr()
	i, _ := slices.BinarySearchFunc(o.sorted, first, netip.Addr.Compare)
	for ; i < len(o.sorted) && p.Contains(o.sorted[i]); i++ {
		if w := o.ips[o.sorted[i]]; w.ns != ns {
			return o.sorted[i], w, true
		}
	}
	return netip.Addr{}, owner{}, false
}

// addrClaim is one accepted spec.addresses entry, for rule 3.
type addrClaim struct {
	prefix netip.Prefix // masked
	se     *networkingv1.ServiceEntry
	export exportSet
}

// claimAddresses applies the rules to one ServiceEntry's parsed addresses
// (oldest entries first, so claims holds the accepted ones of every older
// entry) and returns the ones it keeps; refusals are added to bad as
// "spec.addresses[i]: why".
func (o *owned) claimAddresses(se *networkingv1.ServiceEntry, exp exportSet, parsed []parsedAddr, claims *[]addrClaim, bad *[]string) []parsedAddr {
	var keep []parsedAddr
	for _, pa := range parsed {
		p := pa.prefix
		refuse := func(format string, args ...any) {
			*bad = append(*bad, fmt.Sprintf("spec.addresses[%d]: %s ", pa.index, se.Spec.Addresses[pa.index])+fmt.Sprintf(format, args...)+"; refused")
		}
		if p.Bits() == 0 {
			refuse("covers every address, including pods, nodes and other namespaces' Services")
			continue
		}
		if ip, w, ok := o.ownerIn(p, se.Namespace); ok {
			if p.Bits() == p.Addr().BitLen() {
				refuse("is the address of %s", w.what)
			} else {
				refuse("contains %s, the address of %s", ip, w.what)
			}
			continue
		}
		var holder *networkingv1.ServiceEntry
		for _, c := range *claims {
			if c.se.Namespace != se.Namespace && c.prefix.Overlaps(p) && c.export.meets(c.se.Namespace, exp, se.Namespace) {
				holder = c.se
				break
			}
		}
		if holder != nil {
			why := "created earlier"
			if holder.CreationTimestamp.Equal(&se.CreationTimestamp) {
				why = "created at the same time and first by namespace/name"
			}
			refuse("overlaps an address of ServiceEntry %s/%s, which holds it (%s; the oldest ServiceEntry keeps an address)", holder.Namespace, holder.Name, why)
			continue
		}
		if !exp.none() { // an entry nobody sees holds nothing against others
			*claims = append(*claims, addrClaim{prefix: p.Masked(), se: se, export: exp})
		}
		keep = append(keep, pa)
	}
	return keep
}

// parsedAddr is one spec.addresses entry that is an IP or a CIDR.
type parsedAddr struct {
	index  int
	prefix netip.Prefix // a single IP is /32 or /128
}

// ownershipChange says why a Pod, Service or Node change must re-translate
// everything ("" when it need not): it moves an address into or out of a
// ServiceEntry's spec.addresses, so which of them the ServiceEntry keeps
// may change.
func (tr *Translator) ownershipChange(svcCh []objChange[*corev1.Service], podCh []objChange[*corev1.Pod], nodeCh []objChange[*corev1.Node]) string {
	claimed := tr.t.seAddrs
	if len(claimed) == 0 {
		return ""
	}
	hit := func(ips []netip.Addr) bool {
		for _, ip := range ips {
			ip = ip.Unmap()
			for _, p := range claimed {
				if p.Contains(ip) {
					return true
				}
			}
		}
		return false
	}
	moved := func(a, b []netip.Addr) bool { return !slices.Equal(a, b) && (hit(a) || hit(b)) }
	for _, c := range podCh {
		var a, b []netip.Addr
		if c.old != nil {
			a = podIPs(c.old)
		}
		if c.new != nil {
			b = podIPs(c.new)
		}
		// A pod moving between namespaces' ownership keeps its IP; only
		// appearing, vanishing and readdressing matter (hostNetwork is
		// immutable).
		if moved(a, b) {
			return "Pod address inside a ServiceEntry's addresses changed"
		}
	}
	for _, c := range svcCh {
		var a, b []netip.Addr
		if c.old != nil {
			a = serviceVIPs(c.old)
		}
		if c.new != nil {
			b = serviceVIPs(c.new)
		}
		if moved(a, b) {
			return "Service address inside a ServiceEntry's addresses changed"
		}
	}
	for _, c := range nodeCh {
		var a, b []netip.Addr
		if c.old != nil {
			a = nodeIPs(c.old)
		}
		if c.new != nil {
			b = nodeIPs(c.new)
		}
		if moved(a, b) {
			return "Node address inside a ServiceEntry's addresses changed"
		}
	}
	return ""
}

// nodeIPs are a Node's internal and external addresses.
func nodeIPs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip)
		}
	}
	return out
}
