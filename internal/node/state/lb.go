package state

import (
	"errors"
	"math/rand/v2"
)

// Endpoint selection errors; callers branch on them with errors.Is.
var (
	// ErrNoEndpoints: the service has no endpoints at all.
	ErrNoEndpoints = errors.New("state: service has no endpoints")
	// ErrUnknownPort: no endpoint can serve the requested service port (the
	// service does not declare it, or it is a named port no endpoint
	// resolves).
	ErrUnknownPort = errors.New("state: no endpoint serves the service port")
	// ErrNoHealthyEndpoint: endpoints serve the port, but none survives the
	// health, reachability, locality (STRICT) and capacity filters.
	ErrNoHealthyEndpoint = errors.New("state: no healthy upstream")
)

// SelectEndpoint picks an endpoint of svc for a connection from src to
// servicePort and returns it with its target port (docs/protocol.md#workload-api,
// "ztunnel LB").
//
// An endpoint is eligible if it is healthy (any health with ALLOW_ALL), has a
// target port (its own mapping for servicePort, else the service's
// target_port; 0 there is a named port that must come from the endpoint; an
// application-tunnel workload falls back to servicePort) and is reachable
// from src: on src's network by an IP or a hostname, on another network
// only through its network gateway (double HBONE; an address there means
// nothing on src's network, and a workload without a gateway is never
// dialled directly). A nil src has no network: only the address-less rule
// applies (an endpoint with neither address nor gateway is unreachable). With
// STRICT or FAILOVER load balancing, eligible endpoints are ranked by how many
// leading routing preferences (NETWORK, REGION, ZONE, SUBZONE, NODE, CLUSTER)
// they share with src; STRICT keeps only full matches, both keep the best
// rank. The winner is drawn at random weighted by Capacity (0 is never
// picked).
//
// src may be nil (no preference matches). rnd(n) must return a number in
// [0, n); nil means math/rand/v2.IntN. On a warm snapshot SelectEndpoint does
// not allocate.
func (snap *Snapshot) SelectEndpoint(svc *Service, servicePort uint16, src *Workload, rnd func(n int) int) (*Workload, uint16, error) {
	return snap.selectEndpoint(svc, servicePort, src, rnd, false)
}

// SelectGatewayEndpoint is SelectEndpoint for the service of a network
// gateway: its endpoints are on the remote network they front, dialled by
// their address from src's, so the cross-network rule does not apply (the
// address-less one, health, ports and preferences do).
func (snap *Snapshot) SelectGatewayEndpoint(svc *Service, servicePort uint16, src *Workload, rnd func(n int) int) (*Workload, uint16, error) {
	return snap.selectEndpoint(svc, servicePort, src, rnd, true)
}

func (snap *Snapshot) selectEndpoint(svc *Service, servicePort uint16, src *Workload, rnd func(n int) int, gateway bool) (*Workload, uint16, error) {
	eps := snap.EndpointsByKey(svc.Key)
	if len(eps) == 0 {
		return nil, 0, ErrNoEndpoints
	}
	svcTarget, _ := svc.TargetPort(servicePort)
	sel := selector{servicePort: servicePort, svcTarget: svcTarget, src: src, gateway: gateway}
	if lb := svc.LoadBalancing; lb != nil {
		sel.allowAll = lb.HealthPolicy == AllowAll
		if lb.Mode == LBModeStrict || lb.Mode == LBModeFailover {
			sel.prefs = lb.RoutingPreference
			sel.strict = lb.Mode == LBModeStrict
		}
	}
	if src != nil {
		sel.srcNetwork = src.Network
	}

	// Pass 1: best rank and the total capacity at that rank.
	best, total, anyPort := -1, uint64(0), false
	for i := range eps {
		rank, _, portOK := sel.eval(&eps[i])
		anyPort = anyPort || portOK
		if rank < 0 {
			continue
		}
		if rank > best {
			best, total = rank, 0
		}
		if rank == best {
			total += uint64(eps[i].Workload.Capacity)
		}
	}
	if total == 0 {
		if !anyPort {
			return nil, 0, ErrUnknownPort
		}
		return nil, 0, ErrNoHealthyEndpoint
	}
	// Pass 2: weighted draw among the best-ranked.
	if rnd == nil {
		rnd = rand.IntN
	}
	r := uint64(rnd(int(total)))
	for i := range eps {
		rank, port, _ := sel.eval(&eps[i])
		if rank != best {
			continue
		}
		c := uint64(eps[i].Workload.Capacity)
		if r < c {
			return eps[i].Workload, port, nil
		}
		r -= c
	}
	return nil, 0, ErrNoHealthyEndpoint // unreachable with a conforming rnd
}

type selector struct {
	servicePort, svcTarget uint16
	src                    *Workload
	srcNetwork             string
	allowAll, strict       bool
	gateway                bool // selecting a network gateway: any network
	prefs                  []LBScope
}

// eval returns the endpoint's rank (-1 = not eligible), its target port and
// whether it has a target port at all.
func (s *selector) eval(ep *Endpoint) (rank int, port uint16, portOK bool) {
	w := ep.Workload
	port, portOK = s.targetPort(ep)
	if !portOK {
		return -1, 0, false
	}
	if !w.Healthy && !s.allowAll {
		return -1, 0, true
	}
	if len(w.Addresses) == 0 && w.Hostname == "" && (w.NetworkGateway == nil || w.Network == s.srcNetwork) {
		return -1, 0, true
	}
	if s.src != nil && !s.gateway && w.Network != s.srcNetwork && w.NetworkGateway == nil {
		return -1, 0, true
	}
	rank = 0
	if s.src != nil {
		for _, p := range s.prefs {
			if !scopeMatches(p, s.src, w) {
				break
			}
			rank++
		}
	}
	if s.strict && rank != len(s.prefs) {
		return -1, 0, true
	}
	return rank, port, true
}

func (s *selector) targetPort(ep *Endpoint) (uint16, bool) {
	for _, pm := range ep.Ports {
		if pm.ServicePort == s.servicePort && pm.TargetPort != 0 {
			return pm.TargetPort, true
		}
	}
	if s.svcTarget != 0 {
		return s.svcTarget, true
	}
	if ep.Workload.ApplicationTunnel != nil {
		return s.servicePort, true
	}
	return 0, false
}

func scopeMatches(p LBScope, src, w *Workload) bool {
	switch p {
	case ScopeNetwork:
		return src.Network == w.Network
	case ScopeRegion:
		return src.Locality.Region == w.Locality.Region
	case ScopeZone:
		return src.Locality.Zone == w.Locality.Zone
	case ScopeSubzone:
		return src.Locality.Subzone == w.Locality.Subzone
	case ScopeNode:
		return src.Node == w.Node
	case ScopeCluster:
		return src.ClusterID == w.ClusterID
	}
	return false
}
