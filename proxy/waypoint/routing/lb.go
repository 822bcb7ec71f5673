package routing

import (
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/proxy/route"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// backendPolicy is what a DestinationRule adds to a backend (compiled from
// waypointapi.Backend): a subset and a traffic policy. A backend with one
// is balanced here, over the endpoints the workload API lists for the
// service, instead of by the node proxy's endpoint choice.
type backendPolicy struct {
	// pool names the endpoint set whose state (round-robin position,
	// outlier counters, circuit breakers) is shared: host and subset, as
	// Envoy's cluster "outbound|port|subset|host"; the port is added per
	// request.
	pool    string
	subset  string
	members map[string]bool // workload uids; nil: every endpoint (no subset)
	policy
	// ports: portLevelSettings, the policy of each port they name (nil:
	// none); other ports use the embedded policy.
	ports map[uint16]*policy
}

// policy is the traffic policy of one port of a backend.
type policy struct {
	lb       waypointapi.LoadBalancer
	outlier  *outlierPolicy  // nil: no outlier detection
	limits   *limits         // connectionPool; nil: no circuit breaking
	hash     *hashPolicy     // consistentHash; nil: lb
	locality *localityPolicy // localityLbSetting; nil: every endpoint alike
}

func compilePolicy(tp *waypointapi.TrafficPolicy) policy {
	return policy{lb: tp.GetLoadBalancer(), outlier: compileOutlier(tp.GetOutlierDetection()),
		limits: compileLimits(tp.GetConnectionPool()), hash: compileHash(tp.GetConsistentHash()),
		locality: compileLocality(tp.GetLocality())}
}

// at is the policy for requests to port.
func (bp *backendPolicy) at(port uint16) *policy {
	if p, ok := bp.ports[port]; ok {
		return p
	}
	return &bp.policy
}

// compileBackendPolicy returns nil for a backend without a subset or a
// traffic policy (it keeps the node proxy's choice).
func compileBackendPolicy(b *waypointapi.Backend) *backendPolicy {
	tp := b.GetTrafficPolicy()
	if b.GetSubset() == "" && tp == nil {
		return nil
	}
	p := &backendPolicy{pool: b.GetNamespace() + "/" + b.GetHostname() + "|" + b.GetSubset(), subset: b.GetSubset(),
		policy: compilePolicy(tp)}
	for port, pp := range tp.GetPortPolicies() {
		if p.ports == nil {
			p.ports = map[uint16]*policy{}
		}
		c := compilePolicy(pp)
		p.ports[uint16(port)] = &c
	}
	if b.GetSubset() != "" {
		p.members = make(map[string]bool, len(b.GetSubsetWorkloads()))
		for _, uid := range b.GetSubsetWorkloads() {
			p.members[uid] = true
		}
	}
	return p
}

// pools is a waypoint's per-endpoint state, kept across config updates so
// that an ejection outlives a push. Keyed by backendPolicy.pool and port.
type pools struct{ m sync.Map } // string → *pool

// pool is the state of one endpoint set.
type pool struct {
	rr      atomic.Uint64 // round-robin position
	size    atomic.Int64  // endpoints seen by the latest pick (for max_ejection_percent)
	eps     sync.Map      // workload uid → *endpointStats
	entries atomic.Int64  // how many eps holds
	pruning atomic.Bool
	cb      breaker                   // circuit breakers (breaker.go)
	table   atomic.Pointer[hashTable] // the consistent hash table of the latest endpoint set (hash.go)
}

// endpointStats are one endpoint's counters; every field is atomic, so the
// data path never locks.
type endpointStats struct {
	active       atomic.Int64  // attempts in flight until their response headers (LEAST_REQUEST)
	consec5xx    atomic.Uint32 // consecutive 5xx (and local failures)
	consecGw     atomic.Uint32 // consecutive 502/503/504 (and local failures)
	ejectedUntil atomic.Int64  // unix ns; 0: never ejected
	ejections    atomic.Uint32 // the ejection-time multiplier
}

func (ps *pools) get(key string) *pool {
	if p, ok := ps.m.Load(key); ok {
		return p.(*pool)
	}
	p, _ := ps.m.LoadOrStore(key, &pool{})
	return p.(*pool)
}

func (p *pool) stats(uid string) *endpointStats {
	if s, ok := p.eps.Load(uid); ok {
		return s.(*endpointStats)
	}
	s, loaded := p.eps.LoadOrStore(uid, &endpointStats{})
	if !loaded {
		p.entries.Add(1)
	}
	return s.(*endpointStats)
}

// prune drops the state of endpoints that are gone (pods replaced over
// time), once the pool holds more than twice the current endpoints; one
// pick at a time does it.
func (p *pool) prune(current []state.Endpoint) {
	if p.entries.Load() <= 2*int64(len(current))+16 || !p.pruning.CompareAndSwap(false, true) {
		return
	}
	defer p.pruning.Store(false)
	live := make(map[string]bool, len(current))
	for i := range current {
		live[current[i].Workload.UID] = true
	}
	p.eps.Range(func(k, _ any) bool {
		if !live[k.(string)] {
			p.eps.Delete(k)
			p.entries.Add(-1)
		}
		return true
	})
}

// candidate is one endpoint a request may go to.
type candidate struct {
	w    *state.Workload
	addr netip.AddrPort // pod IP and target port
	st   *endpointStats
	// ejected by outlier detection: only listed for locality priorities,
	// which count them (localityPolicy.narrow drops them).
	ejected bool
}

// Picked is the endpoint a request attempt went to, for its outcome.
type Picked struct {
	pool    *pool
	st      *endpointStats
	outlier *outlierPolicy
	limits  *limits
	uid     string
	// held: what the attempt holds of the pool's circuit breakers
	// (breaker.go), released by Done.
	request bool
	slots   chan struct{} // the connection token taken (Acquire)
}

// pickEndpoint chooses the endpoint of backend b (its subset, not ejected,
// healthy, serving port) by the policy's load balancer and returns the
// routing decision to it, and the choice (for Done). A request over the
// pool's http2MaxRequests is refused (503, UO).
func (rt *Router) pickEndpoint(snap *state.Snapshot, b *backend, port uint16, key hashKey) (route.Decision, *Picked, error) {
	pol := b.policy.at(port)
	d, c, p, err := rt.selectEndpoint(snap, b, pol, port, key)
	if err != nil {
		return d, nil, err
	}
	pk := &Picked{pool: p, st: c.st, outlier: pol.outlier, limits: pol.limits, uid: c.w.UID}
	if pol.limits != nil {
		if err := p.cb.admitRequest(pol.limits, b.hostname); err != nil {
			return route.Decision{}, nil, err
		}
		pk.request = true
	}
	c.st.active.Add(1)
	return d, pk, nil
}

// mirrorDecision is where a mirror's copy of a request goes: its subset
// and load balancer as for a route backend (without counting towards
// outlier detection: the answer is dropped), else the node proxy's choice.
func (rt *Router) mirrorDecision(snap *state.Snapshot, b *backend, dst netip.AddrPort, port uint16) (route.Decision, error) {
	switch {
	case b.missingSubset != "":
		return route.Decision{}, &stream.Refusal{Code: 503, Msg: "subset " + b.missingSubset + " of " + b.hostname + " is not defined (DestinationRule)"}
	case b.policy != nil:
		d, _, _, err := rt.selectEndpoint(snap, b, b.policy.at(port), port, hashKey{})
		return d, err
	}
	return rt.resolve(snap, dst, b.hostname, b.namespace, port)
}

func (rt *Router) selectEndpoint(snap *state.Snapshot, b *backend, pol *policy, port uint16, key hashKey) (route.Decision, candidate, *pool, error) {
	bp := b.policy
	svc := snap.ServiceByNamespacedHostname(b.namespace, b.hostname)
	if svc == nil || len(svc.VIPs) == 0 {
		return route.Decision{}, candidate{}, nil, &stream.Refusal{Code: 503, Msg: "backend " + b.hostname + " unknown or headless"}
	}
	vip := svc.VIPs[0].Prefix.Addr()
	p := rt.pools.get(bp.pool + "|" + strconv.Itoa(int(port)))
	now := rt.now()
	eps := snap.Endpoints(svc)
	cands := make([]candidate, 0, len(eps))
	total, healthy := 0, 0
	for i := range eps {
		ep := &eps[i]
		wl := ep.Workload
		if !wl.Healthy || bp.members != nil && !bp.members[wl.UID] {
			continue
		}
		tport, ok := endpointPort(svc, ep, port)
		if !ok {
			continue
		}
		ip, ok := route.AddrLike(wl, vip)
		if !ok {
			continue
		}
		total++
		st := p.stats(wl.UID)
		ejected := st.ejectedUntil.Load() > now
		if ejected && pol.locality == nil {
			continue
		}
		if !ejected {
			healthy++
		}
		cands = append(cands, candidate{w: wl, addr: netip.AddrPortFrom(ip, tport), st: st, ejected: ejected})
	}
	p.size.Store(int64(total))
	p.prune(eps)
	if healthy == 0 {
		what := "backend " + b.hostname
		if bp.subset != "" {
			what += " subset " + bp.subset
		}
		return route.Decision{}, candidate{}, nil, &stream.Refusal{Code: 503, Msg: fmt.Sprintf("%s: no healthy upstream (%d endpoints, all ejected or none)", what, total)}
	}
	self := snap.WorkloadByIP("", rt.ip)
	if pol.locality != nil {
		cands = pol.locality.narrow(self, cands, key, rt.rand)
	}
	var c candidate
	if pol.hash != nil && key.ok {
		c = p.byHash(pol.hash, cands, key.h)
	} else {
		c = chooseEndpoint(pol.lb, cands, p, rt.rand)
	}
	d, err := route.OutboundWith(snap, self, c.addr, func(n int) int { return int(rt.rand(uint64(n))) })
	if err != nil {
		return route.Decision{}, candidate{}, nil, &stream.Refusal{Code: 503, Msg: err.Error()}
	}
	if d.Kind == route.Passthrough {
		return route.Decision{}, candidate{}, nil, &stream.Refusal{Code: 503, Msg: "endpoint " + c.addr.String() + " is not in the mesh"}
	}
	return d, c, p, nil
}

// endpointPort is the endpoint's target port for the service port: its own
// mapping, else the service's target port, else (an application tunnel)
// the service port itself.
func endpointPort(svc *state.Service, ep *state.Endpoint, port uint16) (uint16, bool) {
	for _, pm := range ep.Ports {
		if pm.ServicePort == port && pm.TargetPort != 0 {
			return pm.TargetPort, true
		}
	}
	if t, ok := svc.TargetPort(port); ok && t != 0 {
		return t, true
	}
	if ep.Workload.ApplicationTunnel != nil {
		return port, true
	}
	return 0, false
}

// chooseEndpoint applies loadBalancer.simple to non-empty cands. rnd(n)
// returns a number in [0, n).
func chooseEndpoint(lb waypointapi.LoadBalancer, cands []candidate, p *pool, rnd func(uint64) uint64) candidate {
	n := uint64(len(cands))
	if n == 1 {
		return cands[0]
	}
	switch lb {
	case waypointapi.LoadBalancer_ROUND_ROBIN:
		return cands[(p.rr.Add(1)-1)%n]
	case waypointapi.LoadBalancer_RANDOM:
		return cands[rnd(n)]
	case waypointapi.LoadBalancer_LEAST_REQUEST:
		// Envoy's power of two choices: the less busy of two at random.
		i := rnd(n)
		j := rnd(n - 1)
		if j >= i {
			j++
		}
		if cands[j].st.active.Load() < cands[i].st.active.Load() {
			return cands[j]
		}
		return cands[i]
	}
	// LB_DEFAULT: weighted by capacity, as the node proxy picks.
	var total uint64
	for i := range cands {
		total += uint64(cands[i].w.Capacity)
	}
	if total == 0 {
		return cands[rnd(n)]
	}
	r := rnd(total)
	for i := range cands {
		c := uint64(cands[i].w.Capacity)
		if r < c {
			return cands[i]
		}
		r -= c
	}
	return cands[n-1]
}
