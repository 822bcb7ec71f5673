package state

import (
	"cmp"
	"encoding/binary"
	"iter"
	"net/netip"
	"slices"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
)

// WorkloadByUID returns the workload with that uid, or nil.
func (snap *Snapshot) WorkloadByUID(uid string) *Workload {
	w, _ := snap.workloads.get(uid)
	return w
}

// WorkloadByIP returns the workload owning ip on network ("" = default
// network), or nil. Host-network workloads are never returned. When two
// workloads claim one IP, the last one applied wins.
func (snap *Snapshot) WorkloadByIP(network string, ip netip.Addr) *Workload {
	w, _ := snap.workloadIP.get(ipKey(network, ip))
	return w
}

// ServiceByVIP returns the service with VIP ip on network, or nil. An exact
// VIP comes first; among several services sharing it, one in
// preferNamespace wins ("" = no preference), else a canonical one, else the
// one with the smallest key. CIDR VIPs are consulted only for an address
// nobody owns: not a service's exact VIP (even one hidden from
// preferNamespace) and not a workload's IP (host-network workloads
// included, so node addresses too). A ServiceEntry range is a tenant's
// statement about addresses outside the mesh; it must never capture a pod,
// a node or another tenant's Service, whatever it covers (0.0.0.0/0
// included). Among the ranges containing ip they are ranked as upstream
// ztunnel ranks them: a service in preferNamespace, then the longest
// prefix, then canonical, then the smallest key (so a wider CIDR of the
// client's namespace beats a narrower one of another namespace; the control
// plane refuses cross-namespace overlaps, so this ordering only decides
// between one namespace's own entries). With a preferNamespace, services
// not exported to it are skipped. It does not allocate.
func (snap *Snapshot) ServiceByVIP(network string, ip netip.Addr, preferNamespace string) *Service {
	ip = ip.Unmap()
	if svcs, ok := snap.serviceVIP.get(netAddr{network, ip}); ok {
		// Held by a service: never a range's, even when the client may
		// not see the holder.
		return pickService(svcs, preferNamespace)
	}
	if snap.servicePfx.empty() || snap.ownedByWorkload(network, ip) {
		return nil
	}
	return snap.servicePfx.lookup(network, ip, preferNamespace)
}

// ServiceByExactVIP is ServiceByVIP without ranges: the service whose VIP is
// exactly ip, or nil.
func (snap *Snapshot) ServiceByExactVIP(network string, ip netip.Addr, preferNamespace string) *Service {
	if svcs, ok := snap.serviceVIP.get(netAddr{network, ip.Unmap()}); ok {
		return pickService(svcs, preferNamespace)
	}
	return nil
}

// ownedByWorkload reports whether a workload (host-network ones included)
// has ip on network.
func (snap *Snapshot) ownedByWorkload(network string, ip netip.Addr) bool {
	if _, ok := snap.workloadIP.get(netAddr{network, ip}); ok {
		return true
	}
	_, ok := snap.hostIP.get(netAddr{network, ip})
	return ok
}

// hidden reports whether s is invisible to clients of namespace ns.
func hidden(s *Service, ns string) bool { return !s.VisibleTo(ns) }

// pickService picks from services sorted by key: preferNamespace, then
// canonical, then the first; nil when none is visible.
func pickService(svcs []*Service, preferNamespace string) *Service {
	var first, canonical *Service
	for _, s := range svcs {
		if hidden(s, preferNamespace) {
			continue
		}
		if preferNamespace != "" && s.Namespace == preferNamespace {
			return s
		}
		if first == nil {
			first = s
		}
		if canonical == nil && s.Canonical {
			canonical = s
		}
	}
	if canonical != nil {
		return canonical
	}
	return first
}

// prefixVIP is a service VIP that is a CIDR rather than one IP.
type prefixVIP struct {
	network string
	prefix  netip.Prefix // masked
	svc     *Service
}

// prefixTable indexes the CIDR VIPs of one snapshot for longest-prefix
// lookups. entries is sorted by family, prefix length (longest first),
// network, address, then service key; groups holds one run of entries per
// (family, length). A lookup masks the IP once per length present and
// binary-searches that run on the address as two integers:
// O(lengths × log n), no allocation. It is built by finish when the CIDR
// set changed and never modified afterwards.
type prefixTable struct {
	entries []prefixEntry
	groups  []prefixGroup
}

type prefixEntry struct {
	prefixVIP
	hi, lo uint64 // the masked address as 16 bytes (IPv4 mapped), big-endian
}

type prefixGroup struct {
	is6    bool
	bits   int // as 128-bit address (IPv4 /n is 96+n)
	lo, hi int // entries[lo:hi]
}

// addr128 is a as 16 bytes (IPv4 mapped) in two big-endian halves.
func addr128(a netip.Addr) (hi, lo uint64) {
	b := a.As16()
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
}

// mask128 keeps the first bits bits of (hi, lo).
func mask128(hi, lo uint64, bits int) (uint64, uint64) {
	switch {
	case bits >= 128:
		return hi, lo
	case bits > 64:
		return hi, lo &^ (^uint64(0) >> (bits - 64))
	case bits == 64:
		return hi, 0
	}
	return hi &^ (^uint64(0) >> bits), 0
}

func bits128(p netip.Prefix) int {
	if p.Addr().Is4() {
		return 96 + p.Bits()
	}
	return p.Bits()
}

func compareEntry(x, y *prefixEntry) int {
	if c := cmp.Compare(boolIdx(x.prefix.Addr().Is6()), boolIdx(y.prefix.Addr().Is6())); c != 0 {
		return c
	}
	if c := y.prefix.Bits() - x.prefix.Bits(); c != 0 {
		return c
	}
	if c := strings.Compare(x.network, y.network); c != 0 {
		return c
	}
	if c := cmp.Compare(x.hi, y.hi); c != 0 {
		return c
	}
	if c := cmp.Compare(x.lo, y.lo); c != 0 {
		return c
	}
	return strings.Compare(x.svc.Key, y.svc.Key)
}

func boolIdx(b bool) int {
	if b {
		return 1
	}
	return 0
}

// newPrefixTable sorts and groups the CIDR VIPs.
func newPrefixTable(vips []prefixVIP) prefixTable {
	if len(vips) == 0 {
		return prefixTable{}
	}
	t := prefixTable{entries: make([]prefixEntry, len(vips))}
	for i, v := range vips {
		e := &t.entries[i]
		e.prefixVIP = v
		e.hi, e.lo = addr128(v.prefix.Addr())
	}
	slices.SortFunc(t.entries, func(x, y prefixEntry) int { return compareEntry(&x, &y) })
	for i := range t.entries {
		e := &t.entries[i]
		is6, bits := e.prefix.Addr().Is6(), bits128(e.prefix)
		if n := len(t.groups); n > 0 && t.groups[n-1].is6 == is6 && t.groups[n-1].bits == bits {
			t.groups[n-1].hi = i + 1
			continue
		}
		t.groups = append(t.groups, prefixGroup{is6: is6, bits: bits, lo: i, hi: i + 1})
	}
	return t
}

func (t *prefixTable) empty() bool { return len(t.groups) == 0 }

// vips returns the table's CIDR VIPs (a new slice, for a builder to edit).
func (t *prefixTable) vips() []prefixVIP {
	out := make([]prefixVIP, len(t.entries))
	for i := range t.entries {
		out[i] = t.entries[i].prefixVIP
	}
	return out
}

// lookup returns the best CIDR VIP service containing ip (see ServiceByVIP).
func (t *prefixTable) lookup(network string, ip netip.Addr, preferNamespace string) *Service {
	if len(t.groups) == 0 {
		return nil
	}
	var best *Service
	bestInNs, bestBits := false, 0
	is6 := ip.Is6()
	iphi, iplo := addr128(ip)
	for _, g := range t.groups {
		if g.is6 != is6 {
			continue
		}
		if best != nil && (bestInNs || preferNamespace == "") {
			// Longest first: a shorter prefix can only win by namespace.
			break
		}
		khi, klo := mask128(iphi, iplo, g.bits)
		// First entry of the run at or after (network, key).
		lo, hi := g.lo, g.hi
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			e := &t.entries[mid]
			var less bool
			if e.network != network {
				less = e.network < network
			} else {
				less = e.hi < khi || e.hi == khi && e.lo < klo
			}
			if less {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		for i := lo; i < g.hi; i++ {
			e := &t.entries[i]
			if e.hi != khi || e.lo != klo || e.network != network {
				break
			}
			if hidden(e.svc, preferNamespace) {
				continue
			}
			inNs := preferNamespace != "" && e.svc.Namespace == preferNamespace
			if best == nil || inNs && !bestInNs ||
				inNs == bestInNs && bestBits == g.bits && e.svc.Canonical && !best.Canonical {
				best, bestInNs, bestBits = e.svc, inNs, g.bits
			}
		}
	}
	return best
}

// ServiceByHost returns the service with key "namespace/hostname", or nil.
func (snap *Snapshot) ServiceByHost(key string) *Service {
	s, _ := snap.services.get(key)
	return s
}

// ServiceByNamespacedHostname is ServiceByHost(ns+"/"+hostname) without
// allocating for keys up to 253 bytes.
func (snap *Snapshot) ServiceByNamespacedHostname(ns, hostname string) *Service {
	var buf [254]byte
	n := len(ns) + 1 + len(hostname)
	if n > len(buf) {
		return snap.ServiceByHost(ns + "/" + hostname)
	}
	b := buf[:0]
	b = append(b, ns...)
	b = append(b, '/')
	b = append(b, hostname...)
	m := snap.services
	if m.n == 0 {
		return nil
	}
	return m.shards[hashBytes(b)%shardCount][string(b)]
}

// ServiceForGateway returns the service a hostname GatewayAddress names, or
// nil (also for address gateways).
func (snap *Snapshot) ServiceForGateway(g *GatewayAddress) *Service {
	if g == nil || !g.IsHostname() {
		return nil
	}
	return snap.ServiceByNamespacedHostname(g.Hostname.Namespace, g.Hostname.Hostname)
}

// ServicesByHostname returns every service with that hostname (several
// namespaces may define one ServiceEntry host), sorted by key.
func (snap *Snapshot) ServicesByHostname(hostname string) []*Service {
	s, _ := snap.serviceHst.get(hostname)
	return s
}

// WorkloadsOnNode returns the workloads scheduled on node, sorted by UID.
func (snap *Snapshot) WorkloadsOnNode(node string) []*Workload {
	ws, _ := snap.byNode.get(node)
	return ws
}

// Endpoints returns the endpoints of the service (workloads whose Services
// name its key), in no particular order.
func (snap *Snapshot) Endpoints(svc *Service) []Endpoint {
	return snap.EndpointsByKey(svc.Key)
}

// EndpointsByKey is Endpoints for a service key "ns/hostname"; the service
// itself need not be known yet.
func (snap *Snapshot) EndpointsByKey(key string) []Endpoint {
	eps, _ := snap.endpoints.get(key)
	return eps
}

// Policy returns the policy with key "ns/name", or nil.
func (snap *Snapshot) Policy(key string) *rbac.Policy {
	p, _ := snap.policies.get(key)
	return p
}

// PoliciesFor returns the policies that apply to w (docs/protocol.md#authorization-policy), sorted by key: NAMESPACE-scope policies of w.Namespace, GLOBAL
// policies, and w.AuthorizationPolicies (unknown keys skipped). The result is
// computed once per workload per snapshot and then served without
// allocating.
func (snap *Snapshot) PoliciesFor(w *Workload) []*rbac.Policy {
	if v, ok := snap.policyCache.Load(w); ok {
		return *v.(*[]*rbac.Policy)
	}
	var out []*rbac.Policy
	ns, _ := snap.policiesNS.get(w.Namespace)
	out = append(out, ns...)
	global, _ := snap.policiesNS.get("")
	out = append(out, global...)
	for _, k := range w.AuthorizationPolicies {
		if p, ok := snap.policies.get(k); ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *rbac.Policy) int { return strings.Compare(a.Key, b.Key) })
	out = slices.Clip(slices.Compact(out))
	v, _ := snap.policyCache.LoadOrStore(w, &out)
	return *v.(*[]*rbac.Policy)
}

// PolicyKeysFor returns the keys of PoliciesFor(w).
func (snap *Snapshot) PolicyKeysFor(w *Workload) []string {
	ps := snap.PoliciesFor(w)
	keys := make([]string, len(ps))
	for i, p := range ps {
		keys[i] = p.Key
	}
	return keys
}

// NumWorkloads, NumServices and NumPolicies count the snapshot's resources.
func (snap *Snapshot) NumWorkloads() int { return snap.workloads.len() }

// NumServices counts services.
func (snap *Snapshot) NumServices() int { return snap.services.len() }

// NumPolicies counts policies.
func (snap *Snapshot) NumPolicies() int { return snap.policies.len() }

// Workloads iterates over all workloads in no particular order.
func (snap *Snapshot) Workloads() iter.Seq[*Workload] { return values(snap.workloads) }

// Services iterates over all services in no particular order.
func (snap *Snapshot) Services() iter.Seq[*Service] { return values(snap.services) }

// Policies iterates over all policies in no particular order.
func (snap *Snapshot) Policies() iter.Seq[*rbac.Policy] { return values(snap.policies) }

func values[V any](m *shardMap[string, V]) iter.Seq[V] {
	return func(yield func(V) bool) {
		for _, v := range m.all() {
			if !yield(v) {
				return
			}
		}
	}
}

// ConfigDump is the JSON-able content of a snapshot for the admin config
// dump, each list sorted by key.
type ConfigDump struct {
	Generation uint64         `json:"generation"`
	Workloads  []*Workload    `json:"workloads"`
	Services   []*Service     `json:"services"`
	Policies   []*rbac.Policy `json:"policies"`
}

// Dump returns the snapshot's content for the admin config dump.
func (snap *Snapshot) Dump() ConfigDump {
	d := ConfigDump{
		Generation: snap.Generation,
		Workloads:  slices.SortedFunc(snap.Workloads(), func(a, b *Workload) int { return cmp.Compare(a.UID, b.UID) }),
		Services:   slices.SortedFunc(snap.Services(), func(a, b *Service) int { return cmp.Compare(a.Key, b.Key) }),
		Policies:   slices.SortedFunc(snap.Policies(), func(a, b *rbac.Policy) int { return cmp.Compare(a.Key, b.Key) }),
	}
	return d
}
