package translate

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/xds/resmap"
)

// EastWestClass is the GatewayClass of the east-west gateways that carry
// traffic into a network from the others (Istio's istio-east-west).
const EastWestClass = "istio-east-west"

// RemoteCluster is one remote cluster's objects as its source last read
// them: pods, services, endpoint slices, namespaces, nodes and Gateways.
// Its policies are not part of it: each primary enforces its own cluster's.
type RemoteCluster struct {
	// ID is the cluster id (the remote secret's data key); it prefixes the
	// uids of its workloads and is their cluster_id.
	ID   string
	Objs *cluster.Objects
}

// Merger adds remote clusters' workloads to the local translation, as
// istiod's multicluster ambient index does (multi-primary):
//
//   - A remote workload is kept only as an endpoint of global services: its
//     services are cut to those of global scope both here (the local
//     Service carries GlobalScopeExtension) and in its own cluster. A
//     remote workload left with no service is not sent, so a local-scope
//     service is never reachable across clusters, and a remote-only
//     service is not created here.
//   - Its uid and cluster_id name its cluster (the remote Translator uses
//     the remote id), its network is its cluster's (the label
//     topology.istio.io/network of its system namespace, of its namespace
//     or of the pod), and its locality comes from its Node there.
//   - A remote workload of another network than this cluster's gets
//     network_gateway: the east-west gateway of its network (a Gateway of
//     class istio-east-west labelled topology.istio.io/network, in any
//     cluster), HBONE port 15008. Without one it gets none and the node
//     proxy refuses it (fail closed); a warning names the network.
//   - Waypoints and policies of remote workloads are dropped: the remote
//     cluster's own node proxies and waypoints enforce them.
//
// Each remote cluster has its own incremental Translator, so a remote pod
// change costs that pod. Everything remote is redone only when what the
// filter reads changes: the set of local global services, this cluster's
// network or the east-west gateways.
//
// A Merger is not safe for concurrent use.
type Merger struct {
	cfg     Config
	remotes map[string]*remoteState

	localGlobal  map[string]bool
	localNetwork string
	gateways     map[string]*workloadapi.GatewayAddress // by network
	// gwWorkloads are the other networks' gateways as workloads (see
	// gatewayWorkloads), by uid, as last put into the output.
	gwWorkloads map[string]*workloadapi.Address
	gwOwners    map[string]gatewayOwner // by network, from eastWestGateways
	// localIPs counts this cluster's workloads per network address;
	// remoteIPs the remote candidates' (workloads of a service global on
	// both sides), across remotes. A remote workload at a local one's
	// address is not sent.
	localIPs, remoteIPs map[netIP]int
	// gen counts changes of what filter reads of this cluster (the global
	// services, the network, the gateways, the local addresses remote
	// workloads hold): a cached filter output of another gen is stale.
	gen uint64

	out      *resmap.Map[*workloadapi.Address]
	warnings []string // the merger's own, sorted
	lastBase []string // the local Warnings merged came from
	// merged is lastBase and mergedWarns (the merger's warnings then).
	merged      []string
	mergedWarns []string
}

type remoteState struct {
	tr     *Translator
	objs   *cluster.Objects
	global map[string]bool // "ns/hostname" of its global services
	gen    uint64          // counts changes of global
	// emitted: its workloads in the output, by uid.
	emitted map[string]emitted
	// cand: the addresses of its candidates (workloads of a service
	// global on both sides, emitted or not), by uid; collided: the
	// candidates not sent because a local workload has their address.
	cand     map[string][]netIP
	collided map[string]bool
	// networks: network → its workloads in the output of that network
	// (for the missing-gateway warning).
	networks map[string]int
	wlNet    map[string]string // uid → network, for networks
}

// emitted is one remote workload in the output: the remote translation's
// address it was made from and the filter generations it was made with,
// so that redoing every remote workload reuses what did not change.
type emitted struct {
	src, out      *workloadapi.Address
	gen, localGen uint64
}

// netIP is a workload address on its network.
type netIP struct {
	network string
	ip      netip.Addr
}

func workloadIPs(w *workloadapi.Workload) []netIP {
	var out []netIP
	for _, b := range w.GetAddresses() {
		if ip, ok := netip.AddrFromSlice(b); ok {
			out = append(out, netIP{w.GetNetwork(), ip.Unmap()})
		}
	}
	return out
}

// setCand records k's candidate addresses (nil: not a candidate).
func (rs *remoteState) setCand(m *Merger, k string, ips []netIP) {
	for _, ip := range rs.cand[k] {
		if m.remoteIPs[ip]--; m.remoteIPs[ip] <= 0 {
			delete(m.remoteIPs, ip)
		}
	}
	if ips == nil {
		delete(rs.cand, k)
		delete(rs.collided, k)
		return
	}
	rs.cand[k] = ips
	for _, ip := range ips {
		m.remoteIPs[ip]++
	}
}

// NewMerger returns a Merger for the local cluster's cfg.
func NewMerger(cfg Config) *Merger {
	return &Merger{cfg: cfg.withDefaults(), remotes: map[string]*remoteState{}, localGlobal: map[string]bool{},
		localIPs: map[netIP]int{}, remoteIPs: map[netIP]int{}}
}

// remoteConfig is the translation configuration of a remote cluster: this
// one's with the remote's id. Config.Network names this cluster's network
// only, so it is cleared: a remote's default network is the label of its
// own system namespace.
func (m *Merger) remoteConfig(id string) Config {
	c := m.cfg
	c.ClusterID = id
	c.Network = ""
	c.EnableExternalNameAlias = false
	c.JWKS = nil
	return c
}

// Merge returns the local result with the remote clusters' workloads
// merged in, and what changed since the previous Merge. local and lch are
// the local Translator's latest Update; localObjs its input. remotes are
// every remote cluster to include (sorted or not); one missing from the
// previous call is dropped.
func (m *Merger) Merge(local *Result, lch *Changes, localObjs *cluster.Objects, remotes []RemoteCluster) (*Result, *Changes) {
	if localObjs == nil {
		localObjs = &cluster.Objects{}
	}
	refilter := false
	// 1. What the filter reads.
	if lch.Full {
		g := map[string]bool{}
		for k, a := range local.Addresses.All() {
			if isGlobal(a.GetService()) {
				g[k] = true
			}
		}
		if !maps.Equal(g, m.localGlobal) {
			refilter = true
		}
		m.localGlobal = g
	} else {
		for k, a := range lch.Addresses {
			if s := a.GetService(); s != nil && isGlobal(s) != m.localGlobal[k] {
				refilter = true
				if isGlobal(s) {
					m.localGlobal[k] = true
				} else {
					delete(m.localGlobal, k)
				}
			}
		}
		for _, k := range lch.Removed {
			if m.localGlobal[k] {
				delete(m.localGlobal, k)
				refilter = true
			}
		}
	}
	net := m.cfg.Network
	if net == "" {
		// Namespaces are sorted by name: no scan per pod change.
		nss := localObjs.Namespaces
		if i, ok := slices.BinarySearchFunc(nss, m.cfg.RootNamespace, func(n *corev1.Namespace, name string) int {
			return cmp.Compare(n.Name, name)
		}); ok {
			net = nss[i].Labels[LabelNetwork]
		}
	}
	if net != m.localNetwork {
		m.localNetwork, refilter = net, true
	}
	gws, owners := m.eastWestGateways(localObjs, remotes)
	m.gwOwners = owners
	if !maps.EqualFunc(gws, m.gateways, func(a, b *workloadapi.GatewayAddress) bool { return proto.Equal(a, b) }) {
		m.gateways, refilter = gws, true
	}
	// This cluster's workload addresses: a change matters only where a
	// remote candidate has the address.
	touch := func(w *workloadapi.Workload, d int) {
		for _, ip := range workloadIPs(w) {
			was := m.localIPs[ip] > 0
			if m.localIPs[ip] += d; m.localIPs[ip] <= 0 {
				delete(m.localIPs, ip)
			}
			if was != (m.localIPs[ip] > 0) && m.remoteIPs[ip] > 0 {
				refilter = true
			}
		}
	}
	if lch.Full {
		old := m.localIPs
		m.localIPs = map[netIP]int{}
		for _, a := range local.Addresses.All() {
			for _, ip := range workloadIPs(a.GetWorkload()) {
				m.localIPs[ip]++
			}
		}
		for ip := range m.remoteIPs {
			if (old[ip] > 0) != (m.localIPs[ip] > 0) {
				refilter = true
				break
			}
		}
	} else {
		for k, a := range lch.Addresses {
			if old, ok := m.out.Get(k); ok {
				touch(old.GetWorkload(), -1)
			}
			touch(a.GetWorkload(), 1)
		}
		for _, k := range lch.Removed {
			if old, ok := m.out.Get(k); ok {
				touch(old.GetWorkload(), -1)
			}
		}
	}
	if refilter {
		m.gen++
	}

	// 2. The output: the local result, plus or minus remote workloads.
	set := map[string]*workloadapi.Address{}
	del := map[string]bool{}
	var e *resmap.Editor[*workloadapi.Address]
	if lch.Full {
		e = resmap.Edit(local.Addresses)
		refilter = true // every remote workload goes back in
	} else {
		e = resmap.Edit(m.out)
		for k, a := range lch.Addresses {
			e.Set(k, a)
		}
		for _, k := range lch.Removed {
			e.Delete(k)
		}
	}
	put := func(k string, a *workloadapi.Address) {
		e.Set(k, a)
		set[k] = a
		delete(del, k)
	}
	drop := func(k string) {
		e.Delete(k)
		del[k] = true
		delete(set, k)
	}

	seen := map[string]bool{}
	for _, rc := range remotes {
		if rc.ID == "" || rc.ID == m.cfg.ClusterID || seen[rc.ID] || rc.Objs == nil {
			continue
		}
		seen[rc.ID] = true
		rs := m.remotes[rc.ID]
		if rs == nil {
			rs = &remoteState{tr: NewTranslator(m.remoteConfig(rc.ID)), emitted: map[string]emitted{},
				cand: map[string][]netIP{}, collided: map[string]bool{},
				networks: map[string]int{}, wlNet: map[string]string{}}
			m.remotes[rc.ID] = rs
		}
		var rres *Result
		rch := &Changes{}
		if rc.Objs != rs.objs {
			rres, rch = rs.tr.Update(eastWestOnly(rc.Objs), nil)
			rs.objs = rc.Objs
		} else {
			rres = rs.tr.Result()
		}
		// Its global services first: the workloads' filter reads them.
		if rch.Full {
			g := map[string]bool{}
			for k, a := range rres.Addresses.All() {
				if isGlobal(a.GetService()) {
					g[k] = true
				}
			}
			if !maps.Equal(g, rs.global) {
				rs.gen++
			}
			rs.global = g
		} else {
			for k, a := range rch.Addresses {
				if s := a.GetService(); s != nil && isGlobal(s) != rs.global[k] {
					rs.gen++
					if isGlobal(s) {
						rs.global[k] = true
					} else {
						delete(rs.global, k)
					}
				}
			}
			for _, k := range rch.Removed {
				if rs.global[k] {
					rs.gen++
					delete(rs.global, k)
				}
			}
		}
		apply := func(k string, a *workloadapi.Address) {
			if em, ok := rs.emitted[k]; ok && em.src == a && em.gen == rs.gen && em.localGen == m.gen {
				// Unchanged: the same resource as before, pushed only
				// when the output lost it (a local full translation).
				if cur, ok := e.Get(k); !ok || cur != em.out {
					put(k, em.out)
				}
				return
			}
			w, ips, collided := m.filter(rs, a)
			rs.setCand(m, k, ips)
			if collided {
				rs.collided[k] = true
			} else {
				delete(rs.collided, k)
			}
			if w == nil {
				if _, ok := rs.emitted[k]; ok {
					rs.forget(k)
					drop(k)
				}
				return
			}
			rs.remember(k, w.GetWorkload().GetNetwork(), emitted{src: a, out: w, gen: rs.gen, localGen: m.gen})
			put(k, w)
		}
		if refilter || rch.Full {
			for k := range rs.cand {
				if _, ok := rres.Addresses.Get(k); !ok {
					rs.setCand(m, k, nil)
				}
			}
			for k := range rs.emitted {
				if _, ok := rres.Addresses.Get(k); !ok {
					rs.forget(k)
					drop(k)
				}
			}
			for k, a := range rres.Addresses.All() {
				apply(k, a)
			}
		} else {
			for k, a := range rch.Addresses {
				apply(k, a)
			}
			for _, k := range rch.Removed {
				rs.setCand(m, k, nil)
				if _, ok := rs.emitted[k]; ok {
					rs.forget(k)
					drop(k)
				}
			}
		}
	}
	for id, rs := range m.remotes {
		if seen[id] {
			continue
		}
		for k := range rs.emitted {
			drop(k)
		}
		for k := range rs.cand {
			rs.setCand(m, k, nil)
		}
		delete(m.remotes, id)
	}
	gwWls := m.gatewayWorkloads()
	for k := range m.gwWorkloads {
		if _, ok := gwWls[k]; !ok {
			drop(k)
		}
	}
	for k, a := range gwWls {
		if old, ok := m.gwWorkloads[k]; lch.Full || !ok || !proto.Equal(old, a) {
			put(k, a)
		} else {
			gwWls[k] = old
		}
	}
	m.gwWorkloads = gwWls
	m.out = e.Done()
	m.updateWarnings()

	res := *local
	res.Addresses = m.out
	res.Warnings = m.mergedWarnings(local.Warnings)
	ch := *lch
	if !lch.Full && (len(set) > 0 || len(del) > 0) {
		ch.Addresses = make(map[string]*workloadapi.Address, len(lch.Addresses)+len(set))
		maps.Copy(ch.Addresses, lch.Addresses)
		maps.Copy(ch.Addresses, set)
		removed := slices.Clone(lch.Removed)
		for k := range del {
			removed = append(removed, k)
		}
		sort.Strings(removed)
		ch.Removed = removed
	}
	return &res, &ch
}

func (rs *remoteState) remember(k, network string, em emitted) {
	if old, ok := rs.wlNet[k]; ok {
		if rs.networks[old]--; rs.networks[old] <= 0 {
			delete(rs.networks, old)
		}
	}
	rs.emitted[k] = em
	rs.wlNet[k] = network
	rs.networks[network]++
}

func (rs *remoteState) forget(k string) {
	if old, ok := rs.wlNet[k]; ok {
		if rs.networks[old]--; rs.networks[old] <= 0 {
			delete(rs.networks, old)
		}
	}
	delete(rs.emitted, k)
	delete(rs.wlNet, k)
}

// filter turns one address of a remote translation into what this
// cluster's node proxies get: nil for a service or for a workload of no
// service global on both sides.
//
// It also returns the addresses of a candidate (a workload of a service
// global on both sides; nil otherwise), and whether such a candidate is
// withheld because a workload of this cluster has one of its addresses on
// its network: node proxies would see two workloads at one address, and
// the remote one could take the local one's traffic (fail closed).
func (m *Merger) filter(rs *remoteState, a *workloadapi.Address) (*workloadapi.Address, []netIP, bool) {
	w := a.GetWorkload()
	if w == nil {
		return nil, nil, false
	}
	var svcs map[string]*workloadapi.PortList
	for k, pl := range w.Services {
		if m.localGlobal[k] && rs.global[k] {
			if svcs == nil {
				svcs = map[string]*workloadapi.PortList{}
			}
			svcs[k] = pl
		}
	}
	if svcs == nil {
		return nil, nil, false
	}
	ips := workloadIPs(w)
	for _, ip := range ips {
		if m.localIPs[ip] > 0 {
			return nil, ips, true
		}
	}
	c := proto.Clone(w).(*workloadapi.Workload)
	c.Services = svcs
	c.Waypoint = nil
	c.AuthorizationPolicies = nil
	c.ApplicationTunnel = nil
	c.NetworkGateway = nil
	if c.Network != m.localNetwork {
		if gw := m.gateways[c.Network]; gw != nil {
			c.NetworkGateway = proto.Clone(gw).(*workloadapi.GatewayAddress)
		}
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: c}}, ips, false
}

// updateWarnings names each network whose remote workloads have no
// east-west gateway (they are sent without one and refused).
func (m *Merger) updateWarnings() {
	var w []string
	ids := slices.Sorted(maps.Keys(m.remotes))
	for _, id := range ids {
		rs := m.remotes[id]
		if len(rs.collided) > 0 {
			w = append(w, fmt.Sprintf("Cluster %s: workloads at the address of a workload of this cluster on the same network "+
				"are not sent (pod CIDRs overlap on one network)", id))
		}
		for _, n := range slices.Sorted(maps.Keys(rs.networks)) {
			if n != m.localNetwork && m.gateways[n] == nil {
				// No count in the text: it is logged once per change.
				w = append(w, fmt.Sprintf("Cluster %s: workloads of network %q have no east-west gateway "+
					"(a Gateway of class %s labelled %s=%s with a status address and an HBONE listener terminating TLS); "+
					"node proxies of network %q refuse them", id, n, EastWestClass, LabelNetwork, n, m.localNetwork))
			}
		}
	}
	m.warnings = w
}

func (m *Merger) mergedWarnings(base []string) []string {
	if len(m.warnings) == 0 {
		m.merged, m.lastBase, m.mergedWarns = base, base, nil
		return base
	}
	if m.merged != nil && sameStrings(base, m.lastBase) && m.mergedOf(m.warnings) {
		return m.merged
	}
	// Result.Warnings is sorted and deduplicated.
	out := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(base), m.warnings...))))
	m.merged, m.lastBase, m.mergedWarns = out, base, m.warnings
	return out
}

// mergedOf reports whether m.merged was made from warns.
func (m *Merger) mergedOf(warns []string) bool { return slices.Equal(m.mergedWarns, warns) }

func sameStrings(a, b []string) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func isGlobal(s *workloadapi.Service) bool {
	if s == nil {
		return false
	}
	for _, e := range s.Extensions {
		if e.GetName() == GlobalScopeExtension {
			return true
		}
	}
	return false
}

// eastWestOnly keeps of a remote cluster's Gateways only the east-west
// ones: its waypoints do not serve this cluster's clients.
func eastWestOnly(o *cluster.Objects) *cluster.Objects {
	keep := true
	for _, g := range o.Gateways {
		if string(g.Spec.GatewayClassName) != EastWestClass {
			keep = false
			break
		}
	}
	if keep {
		return o
	}
	c := *o
	c.Gateways = nil
	for _, g := range o.Gateways {
		if string(g.Spec.GatewayClassName) == EastWestClass {
			c.Gateways = append(c.Gateways, g)
		}
	}
	return &c
}

// eastWestGateways maps each network to its east-west gateway address:
// Gateways of class istio-east-west in the root namespace labelled
// topology.istio.io/network with an HBONE listener terminating TLS
// (istiod's rule for remote east-west gateways, plus the namespace: see
// EastWestProblem), in this cluster or any remote one. The address is
// the Gateway's first status address (IPAddress or Hostname), else its
// Service's (label gateway.networking.k8s.io/gateway-name) LoadBalancer
// ingress, else, for a Gateway of this cluster only, its ClusterIP. With
// several per network, this cluster's come first, then by cluster id and
// namespace/name.
func (m *Merger) eastWestGateways(local *cluster.Objects, remotes []RemoteCluster) (map[string]*workloadapi.GatewayAddress, map[string]gatewayOwner) {
	type cand struct {
		order string
		addr  *workloadapi.GatewayAddress
		owner gatewayOwner
	}
	best := map[string]cand{}
	consider := func(order, cluster string, objs *cluster.Objects, isLocal bool) {
		for _, g := range objs.Gateways {
			n := g.Labels[LabelNetwork]
			if string(g.Spec.GatewayClassName) != EastWestClass || EastWestProblem(g, m.cfg.RootNamespace) != "" {
				continue
			}
			a := gatewayAddr(g, n, objs, isLocal)
			if a == nil {
				continue
			}
			o := order + "/" + g.Namespace + "/" + g.Name
			if c, ok := best[n]; !ok || o < c.order {
				best[n] = cand{order: o, addr: a, owner: gatewayOwner{cluster: cluster, namespace: g.Namespace, name: g.Name}}
			}
		}
	}
	consider("0", m.cfg.ClusterID, local, true)
	for _, rc := range remotes {
		if rc.Objs != nil && rc.ID != m.cfg.ClusterID {
			consider("1/"+rc.ID, rc.ID, rc.Objs, false)
		}
	}
	out := make(map[string]*workloadapi.GatewayAddress, len(best))
	owners := make(map[string]gatewayOwner, len(best))
	for n, c := range best {
		out[n] = c.addr
		owners[n] = c.owner
	}
	return out, owners
}

// gatewayOwner is the east-west Gateway a network's gateway address came
// from.
type gatewayOwner struct{ cluster, namespace, name string }

// gatewayWorkloads are the east-west gateways of the other networks,
// reached by IP address, as workloads on their networks: node proxies
// resolve a network_gateway address to a workload (or service) on that
// network, for the identity the outer tunnel verifies (Istio's
// fetch_network_gateway), and the gateway's own pods are not sent here
// (they back no global service). Its identity is the Gateway's
// ServiceAccount, which the controller names after the Gateway (the
// east-west mode of cmd/waypoint defaults to it too). A gateway known by
// hostname needs a service of that name instead, and gets nothing here.
func (m *Merger) gatewayWorkloads() map[string]*workloadapi.Address {
	out := map[string]*workloadapi.Address{}
	for n, gw := range m.gateways {
		a := gw.GetAddress()
		o := m.gwOwners[n]
		if n == m.localNetwork || a == nil {
			continue
		}
		uid := o.cluster + "//Gateway/" + o.namespace + "/" + o.name
		td := m.cfg.TrustDomain
		if td == DefaultTrustDomain {
			td = ""
		}
		out[uid] = &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
			Uid: uid, Name: o.name, Namespace: o.namespace, ClusterId: o.cluster, Network: n,
			Addresses: [][]byte{a.GetAddress()}, ServiceAccount: o.name, TrustDomain: td,
			TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Status: workloadapi.WorkloadStatus_HEALTHY,
			CanonicalName: o.name, WorkloadName: o.name, WorkloadType: workloadapi.WorkloadType_DEPLOYMENT,
		}}}
	}
	return out
}

// EastWestProblem says why a Gateway of class istio-east-west is not used
// as its network's gateway ("" when it can be, given an address). root is
// the mesh's root (system) namespace: a network gateway receives every
// tenant's traffic to its network, so one defined in a tenant's namespace
// would let that tenant take (and drop) other tenants' cross-network
// connections; only the root namespace may define one.
func EastWestProblem(g *gatewayv1.Gateway, root string) string {
	switch {
	case string(g.Spec.GatewayClassName) != EastWestClass:
		return "not of class " + EastWestClass
	case g.Namespace != root:
		return "not in the root namespace " + root + " (a network gateway carries every namespace's cross-network traffic)"
	case g.Labels[LabelNetwork] == "":
		return "no label " + LabelNetwork + " naming its network"
	case !hboneTerminate(g):
		return "no listener of protocol HBONE with TLS mode Terminate"
	}
	return ""
}

func hboneTerminate(g *gatewayv1.Gateway) bool {
	for _, l := range g.Spec.Listeners {
		if l.Protocol == "HBONE" && l.TLS != nil && l.TLS.Mode != nil && *l.TLS.Mode == gatewayv1.TLSModeTerminate {
			return true
		}
	}
	return false
}

func gatewayAddr(g *gatewayv1.Gateway, network string, objs *cluster.Objects, isLocal bool) *workloadapi.GatewayAddress {
	mk := func(v string) *workloadapi.GatewayAddress {
		ga := &workloadapi.GatewayAddress{HboneMtlsPort: HBONEPort}
		if ip, err := netip.ParseAddr(v); err == nil {
			ga.Destination = &workloadapi.GatewayAddress_Address{Address: netAddr(network, ip)}
		} else {
			ga.Destination = &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{
				Namespace: g.Namespace, Hostname: strings.TrimSuffix(v, "."),
			}}
		}
		return ga
	}
	for _, a := range g.Status.Addresses {
		if a.Value == "" {
			continue
		}
		if a.Type == nil || *a.Type == gatewayv1.IPAddressType || *a.Type == gatewayv1.HostnameAddressType {
			return mk(a.Value)
		}
	}
	// The Gateway's Service, in the Gateway's namespace (objs.Services is
	// sorted by namespace/name).
	svcs := objs.Services
	i, _ := slices.BinarySearchFunc(svcs, g.Namespace, func(s *corev1.Service, ns string) int { return cmp.Compare(s.Namespace, ns) })
	for ; i < len(svcs) && svcs[i].Namespace == g.Namespace; i++ {
		s := svcs[i]
		if s.Labels[LabelGatewayName] != g.Name {
			continue
		}
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				return mk(in.IP)
			}
			if in.Hostname != "" {
				return mk(in.Hostname)
			}
		}
		if isLocal && s.Spec.ClusterIP != "" && s.Spec.ClusterIP != corev1.ClusterIPNone {
			return mk(s.Spec.ClusterIP)
		}
	}
	return nil
}
