package state

import (
	"net/netip"
	"slices"
	"sync"

	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
)

// Snapshot is one immutable version of the mesh state. All methods are safe
// for concurrent use; returned slices and pointers are shared and must not be
// modified.
type Snapshot struct {
	// Generation counts published snapshots (0 = the empty initial one). It
	// goes into debug logs and the admin config dump.
	Generation uint64

	changed chan struct{} // closed when this snapshot is replaced

	workloads  *shardMap[string, *Workload]    // by UID
	workloadIP *shardMap[netAddr, *Workload]   // by (network, IP); never host-network workloads
	hostIP     *shardMap[netAddr, []*Workload] // host-network workloads by (network, node IP); only to keep ranges off them
	byNode     *shardMap[string, []*Workload]
	endpoints  *shardMap[string, []Endpoint] // by service key "ns/hostname"

	services   *shardMap[string, *Service]    // by key "ns/hostname"
	serviceVIP *shardMap[netAddr, []*Service] // single-IP VIPs
	servicePfx prefixTable                    // CIDR VIPs (rare)
	serviceHst *shardMap[string, []*Service]  // by hostname

	policies   *shardMap[string, *rbac.Policy]   // by key "ns/name"
	policiesNS *shardMap[string, []*rbac.Policy] // NAMESPACE scope by ns; GLOBAL under ""

	policyCache sync.Map // *Workload → *[]*rbac.Policy, filled lazily by PoliciesFor

	// clusters counts workloads by cluster id (KnownCluster); a handful of
	// entries, copied only by an Apply that changes workloads.
	clusters map[string]int
}

// KnownCluster reports whether some workload of the snapshot belongs to
// cluster id: what a peer's word about its cluster (baggage) is checked
// against before it becomes a metric label.
func (s *Snapshot) KnownCluster(id string) bool { return id != "" && s.clusters[id] > 0 }

func emptySnapshot() *Snapshot {
	return &Snapshot{
		changed:    make(chan struct{}),
		workloads:  newShardMap[string, *Workload](hashString),
		workloadIP: newShardMap[netAddr, *Workload](hashNetAddr),
		hostIP:     newShardMap[netAddr, []*Workload](hashNetAddr),
		byNode:     newShardMap[string, []*Workload](hashString),
		endpoints:  newShardMap[string, []Endpoint](hashString),
		services:   newShardMap[string, *Service](hashString),
		serviceVIP: newShardMap[netAddr, []*Service](hashNetAddr),
		serviceHst: newShardMap[string, []*Service](hashString),
		policies:   newShardMap[string, *rbac.Policy](hashString),
		policiesNS: newShardMap[string, []*rbac.Policy](hashString),
	}
}

// Changed returns a channel closed when this snapshot is replaced by a newer
// one.
func (snap *Snapshot) Changed() <-chan struct{} { return snap.changed }

func workloadID(w *Workload) string               { return w.UID }
func endpointID(e Endpoint) string                { return e.Workload.UID }
func serviceID(s *Service) string                 { return s.Key }
func policyID(p *rbac.Policy) string              { return p.Key }
func isSingleIP(p netip.Prefix) bool              { return p.Bits() == p.Addr().BitLen() }
func vipKey(v NetworkAddress) netAddr             { return netAddr{network: v.Network, ip: v.Prefix.Addr()} }
func ipKey(network string, ip netip.Addr) netAddr { return netAddr{network: network, ip: ip.Unmap()} }

// builder edits a snapshot's indexes copy-on-write for one Apply call.
type builder struct {
	old     *Snapshot
	changed bool

	workloads  shardEditor[string, *Workload]
	workloadIP shardEditor[netAddr, *Workload]
	hostIP     listEditor[netAddr, *Workload]
	byNode     listEditor[string, *Workload]
	endpoints  listEditor[string, Endpoint]
	services   shardEditor[string, *Service]
	serviceVIP listEditor[netAddr, *Service]
	serviceHst listEditor[string, *Service]
	servicePfx []prefixVIP // the CIDR VIPs being edited, once pfxDirty
	pfxDirty   bool
	policies   shardEditor[string, *rbac.Policy]
	policiesNS listEditor[string, *rbac.Policy]
	clusters   map[string]int // nil until a workload with a cluster id is edited
}

// countCluster adds d workloads to cluster id's count, copying the old
// snapshot's counts on the first edit.
func (b *builder) countCluster(id string, d int) {
	if id == "" {
		return
	}
	if b.clusters == nil {
		b.clusters = make(map[string]int, len(b.old.clusters)+1)
		for k, v := range b.old.clusters {
			b.clusters[k] = v
		}
	}
	if b.clusters[id] += d; b.clusters[id] <= 0 {
		delete(b.clusters, id)
	}
}

func newBuilder(old *Snapshot) *builder {
	b := &builder{old: old}
	b.workloads.init(old.workloads)
	b.workloadIP.init(old.workloadIP)
	b.hostIP.init(old.hostIP, workloadID, false)
	b.byNode.init(old.byNode, workloadID, true)
	b.endpoints.init(old.endpoints, endpointID, false)
	b.services.init(old.services)
	b.serviceVIP.init(old.serviceVIP, serviceID, true)
	b.serviceHst.init(old.serviceHst, serviceID, true)
	b.policies.init(old.policies)
	b.policiesNS.init(old.policiesNS, policyID, true)
	return b
}

func (b *builder) finish() *Snapshot {
	pfx := b.old.servicePfx
	if b.pfxDirty {
		pfx = newPrefixTable(b.servicePfx)
	}
	clusters := b.old.clusters
	if b.clusters != nil {
		clusters = b.clusters
	}
	return &Snapshot{
		Generation: b.old.Generation + 1,
		changed:    make(chan struct{}),
		workloads:  b.workloads.result(),
		workloadIP: b.workloadIP.result(),
		hostIP:     b.hostIP.result(),
		byNode:     b.byNode.result(),
		endpoints:  b.endpoints.result(),
		services:   b.services.result(),
		serviceVIP: b.serviceVIP.result(),
		servicePfx: pfx,
		serviceHst: b.serviceHst.result(),
		policies:   b.policies.result(),
		policiesNS: b.policiesNS.result(),
		clusters:   clusters,
	}
}

func (b *builder) upsertWorkload(w *Workload) {
	if old, ok := b.workloads.get(w.UID); ok {
		b.unindexWorkload(old)
	}
	b.workloads.set(w.UID, w)
	b.countCluster(w.ClusterID, 1)
	for _, ip := range w.Addresses {
		if w.HostNetwork {
			b.hostIP.add(netAddr{w.Network, ip}, w)
		} else {
			b.workloadIP.set(netAddr{w.Network, ip}, w)
		}
	}
	if w.Node != "" {
		b.byNode.add(w.Node, w)
	}
	for _, sp := range w.Services {
		b.endpoints.add(sp.Service, Endpoint{Workload: w, Ports: sp.Ports})
	}
	b.changed = true
}

func (b *builder) removeWorkload(uid string) {
	old, ok := b.workloads.get(uid)
	if !ok {
		return
	}
	b.unindexWorkload(old)
	b.workloads.delete(uid)
	b.changed = true
}

// unindexWorkload drops old from every secondary index. An IP entry is only
// dropped if it still points at old (another workload may have claimed the
// IP since).
func (b *builder) unindexWorkload(old *Workload) {
	b.countCluster(old.ClusterID, -1)
	for _, ip := range old.Addresses {
		k := netAddr{old.Network, ip}
		if old.HostNetwork {
			b.hostIP.remove(k, old.UID)
		} else if cur, ok := b.workloadIP.get(k); ok && cur == old {
			b.workloadIP.delete(k)
		}
	}
	if old.Node != "" {
		b.byNode.remove(old.Node, old.UID)
	}
	for _, sp := range old.Services {
		b.endpoints.remove(sp.Service, old.UID)
	}
}

func (b *builder) upsertService(s *Service) {
	if old, ok := b.services.get(s.Key); ok {
		b.unindexService(old)
	}
	b.services.set(s.Key, s)
	for _, v := range s.VIPs {
		if isSingleIP(v.Prefix) {
			b.serviceVIP.add(vipKey(v), s)
		} else {
			b.clonePfx()
			b.servicePfx = append(b.servicePfx, prefixVIP{network: v.Network, prefix: v.Prefix, svc: s})
		}
	}
	b.serviceHst.add(s.Hostname, s)
	b.changed = true
}

func (b *builder) removeService(key string) {
	old, ok := b.services.get(key)
	if !ok {
		return
	}
	b.unindexService(old)
	b.services.delete(key)
	b.changed = true
}

func (b *builder) unindexService(old *Service) {
	for _, v := range old.VIPs {
		if isSingleIP(v.Prefix) {
			b.serviceVIP.remove(vipKey(v), old.Key)
		} else {
			b.clonePfx()
			b.servicePfx = slices.DeleteFunc(b.servicePfx, func(p prefixVIP) bool { return p.svc == old })
		}
	}
	b.serviceHst.remove(old.Hostname, old.Key)
}

// clonePfx makes the CIDR VIP list private to this builder.
func (b *builder) clonePfx() {
	if !b.pfxDirty {
		b.servicePfx = b.old.servicePfx.vips()
		b.pfxDirty = true
	}
}

func (b *builder) upsertPolicy(p *rbac.Policy) {
	if old, ok := b.policies.get(p.Key); ok {
		b.unindexPolicy(old)
	}
	b.policies.set(p.Key, p)
	switch p.Scope {
	case rbac.ScopeNamespace:
		b.policiesNS.add(p.Namespace, p)
	case rbac.ScopeGlobal:
		b.policiesNS.add("", p)
	}
	b.changed = true
}

func (b *builder) removePolicy(key string) {
	old, ok := b.policies.get(key)
	if !ok {
		return
	}
	b.unindexPolicy(old)
	b.policies.delete(key)
	b.changed = true
}

func (b *builder) unindexPolicy(old *rbac.Policy) {
	switch old.Scope {
	case rbac.ScopeNamespace:
		b.policiesNS.remove(old.Namespace, old.Key)
	case rbac.ScopeGlobal:
		b.policiesNS.remove("", old.Key)
	}
}
