package state

import (
	"cmp"
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

// ServiceByVIP returns the service with VIP ip on network, or nil. When
// several services share the VIP, one in preferNamespace wins ("" = no
// preference), else the one with the smallest key. CIDR VIPs are consulted
// (longest prefix first) when no service has the exact IP.
func (snap *Snapshot) ServiceByVIP(network string, ip netip.Addr, preferNamespace string) *Service {
	ip = ip.Unmap()
	if svcs, ok := snap.serviceVIP.get(netAddr{network, ip}); ok {
		return pickService(svcs, preferNamespace)
	}
	var best *Service
	bits := 0
	for _, p := range snap.servicePfx {
		if best != nil && p.prefix.Bits() < bits {
			break // sorted longest first: only equally long prefixes can still win
		}
		if p.network != network || !p.prefix.Contains(ip) {
			continue
		}
		if best == nil {
			best, bits = p.svc, p.prefix.Bits()
		} else if p.svc.Namespace == preferNamespace && best.Namespace != preferNamespace {
			best = p.svc
		}
	}
	return best
}

// pickService picks from services sorted by key.
func pickService(svcs []*Service, preferNamespace string) *Service {
	if preferNamespace != "" {
		for _, s := range svcs {
			if s.Namespace == preferNamespace {
				return s
			}
		}
	}
	return svcs[0]
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
