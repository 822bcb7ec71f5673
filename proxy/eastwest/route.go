package eastwest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// Refusals: why the gateway does not forward an outer CONNECT. Route
// returns them wrapped with the hostname; Status maps them to the HTTP
// status the gateway answers and Reason to the log and metric label.
var (
	// ErrUnknownHost: no service has the authority's hostname.
	ErrUnknownHost = errors.New("no service has this hostname")
	// ErrNotGlobal: services of that hostname exist, but none is of global
	// scope (state.Service.Global): the cluster keeps it to itself.
	ErrNotGlobal = errors.New("service is not of global scope (not exported to other clusters)")
	// ErrAmbiguousHost: several global services share the hostname and
	// none is in the namespace a Kubernetes hostname names.
	ErrAmbiguousHost = errors.New("several global services have this hostname")
	// ErrUnknownPort: the service declares no such service port.
	ErrUnknownPort = errors.New("service has no such port")
	// ErrNoEndpoint: no healthy HBONE endpoint of the service (or of its
	// waypoint) is on the gateway's network.
	ErrNoEndpoint = errors.New("no healthy HBONE endpoint on the gateway's network")
	// ErrWaypoint: the service's waypoint cannot be resolved on the
	// gateway's network. The gateway then refuses rather than bypass it.
	ErrWaypoint = errors.New("the service's waypoint is not reachable on the gateway's network")
)

// Status is the HTTP status the gateway answers for a Route error: 404 for
// what the gateway does not serve (unknown, cluster-local and
// port-less services look alike to the client, so a refusal does not
// reveal which services exist), 503 for a service it serves but cannot
// reach now.
func Status(err error) int {
	switch {
	case errors.Is(err, ErrUnknownHost), errors.Is(err, ErrNotGlobal), errors.Is(err, ErrUnknownPort):
		return 404
	}
	return 503
}

// Reason is the closed set of labels for a Route error (metrics, logs).
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrUnknownHost):
		return "unknown_host"
	case errors.Is(err, ErrNotGlobal):
		return "not_global"
	case errors.Is(err, ErrAmbiguousHost):
		return "ambiguous_host"
	case errors.Is(err, ErrUnknownPort):
		return "unknown_port"
	case errors.Is(err, ErrNoEndpoint):
		return "no_endpoint"
	case errors.Is(err, ErrWaypoint):
		return "waypoint_unreachable"
	}
	return "connect_failed"
}

// Decision is where one outer CONNECT goes. Its pointers are the snapshot's.
type Decision struct {
	// Service is the global service the authority named.
	Service *state.Service
	// Workload is the chosen endpoint of Service, or the chosen waypoint
	// pod; nil when the waypoint is named by an address no workload owns.
	Workload *state.Workload
	// Waypoint is true when Addr is the service's waypoint.
	Waypoint bool
	// Addr is what the gateway dials: an HBONE port (the endpoint's node
	// proxy, or the waypoint), never an application port. The inner HBONE
	// bytes go there unchanged.
	Addr netip.AddrPort
}

// Scope is what Route needs to know about the gateway itself.
type Scope struct {
	// Network is the gateway's network ("" = the default network); only
	// endpoints and waypoints on it are chosen.
	Network string
	// EndpointPort is the HBONE port of endpoints' node proxies; 0 means
	// 15008 (Istio's, fixed).
	EndpointPort uint16
}

// Route decides where an outer CONNECT for host:port goes
// (docs/eastwest.md): the one global service of that hostname that
// declares the port; then, if it has a waypoint, a waypoint pod on the
// gateway's network at the waypoint's HBONE port; else a healthy HBONE
// endpoint on the gateway's network at its node proxy's HBONE port,
// weighted by capacity. It never picks an endpoint on another network (no
// transit through two gateways) or one reached without HBONE (the inner
// bytes are HBONE). rnd(n) returns a number in [0, n); nil means
// math/rand/v2.IntN.
func Route(snap *state.Snapshot, scope Scope, host string, port uint16, rnd func(int) int) (Decision, error) {
	if scope.EndpointPort == 0 {
		scope.EndpointPort = state.DefaultHBONEPort
	}
	if rnd == nil {
		rnd = rand.IntN
	}
	svc, err := globalService(snap, host)
	if err != nil {
		return Decision{}, fmt.Errorf("%s:%d: %w", host, port, err)
	}
	d := Decision{Service: svc}
	if _, ok := svc.TargetPort(port); !ok {
		return d, fmt.Errorf("%s:%d: %w", host, port, ErrUnknownPort)
	}
	if wp := svc.Waypoint; wp != nil {
		d.Waypoint = true
		d.Workload, d.Addr, err = resolveWaypoint(snap, scope.Network, wp, rnd)
		if err != nil {
			return d, fmt.Errorf("%s:%d: %w", host, port, err)
		}
		return d, nil
	}
	w := pick(snap.Endpoints(svc), rnd, func(ep *state.Endpoint) bool {
		return ep.Workload.Protocol == state.TunnelHBONE && reachable(ep.Workload, scope.Network, svc) && servesPort(ep, svc, port)
	})
	if w == nil {
		return d, fmt.Errorf("%s:%d: %w", host, port, ErrNoEndpoint)
	}
	d.Workload, d.Addr = w, netip.AddrPortFrom(w.Addresses[0], scope.EndpointPort)
	return d, nil
}

// globalService is the service host names that the gateway may forward
// to: of the services with that hostname, the global ones; of several,
// the one in the namespace a Kubernetes service hostname
// (<name>.<namespace>.svc.<domain>) names.
func globalService(snap *state.Snapshot, host string) (*state.Service, error) {
	svcs := snap.ServicesByHostname(host)
	if len(svcs) == 0 {
		return nil, ErrUnknownHost
	}
	var global []*state.Service
	for _, s := range svcs {
		if s.Global {
			global = append(global, s)
		}
	}
	switch len(global) {
	case 0:
		return nil, ErrNotGlobal
	case 1:
		return global[0], nil
	}
	if labels := strings.Split(host, "."); len(labels) > 2 && labels[2] == "svc" {
		for _, s := range global {
			if s.Namespace == labels[1] {
				return s, nil
			}
		}
	}
	return nil, ErrAmbiguousHost
}

// resolveWaypoint finds a pod of the waypoint wp on network: by service
// hostname (a pod of that service), or by address on that network (the
// workload owning it, else a pod of the service whose VIP it is).
func resolveWaypoint(snap *state.Snapshot, network string, wp *state.GatewayAddress, rnd func(int) int) (*state.Workload, netip.AddrPort, error) {
	port := wp.Port()
	var wsvc *state.Service
	if wp.IsHostname() {
		if wsvc = snap.ServiceForGateway(wp); wsvc == nil {
			return nil, netip.AddrPort{}, fmt.Errorf("%w: service %s/%s unknown", ErrWaypoint, wp.Hostname.Namespace, wp.Hostname.Hostname)
		}
	} else {
		if wp.Address.Network != network {
			return nil, netip.AddrPort{}, fmt.Errorf("%w: address %s is on network %q", ErrWaypoint, wp.Address.IP, wp.Address.Network)
		}
		if w := snap.WorkloadByIP(network, wp.Address.IP); w != nil {
			if !reachable(w, network, nil) {
				return nil, netip.AddrPort{}, fmt.Errorf("%w: workload %s/%s unhealthy", ErrWaypoint, w.Namespace, w.Name)
			}
			return w, netip.AddrPortFrom(wp.Address.IP, port), nil
		}
		if wsvc = snap.ServiceByExactVIP(network, wp.Address.IP, ""); wsvc == nil {
			return nil, netip.AddrPort{}, fmt.Errorf("%w: address %s unknown", ErrWaypoint, wp.Address.IP)
		}
	}
	// A waypoint terminates HBONE itself: its pods need not be captured
	// (their protocol may be TCP), only reachable on this network.
	w := pick(snap.Endpoints(wsvc), rnd, func(ep *state.Endpoint) bool { return reachable(ep.Workload, network, wsvc) })
	if w == nil {
		return nil, netip.AddrPort{}, fmt.Errorf("%w: service %s: %w", ErrWaypoint, wsvc.Hostname, ErrNoEndpoint)
	}
	return w, netip.AddrPortFrom(w.Addresses[0], port), nil
}

// reachable: w is on network, has an IP of its own (not the node's: a
// host-network pod has no node proxy inbound at its IP) and is healthy
// (or svc's load balancing admits unhealthy endpoints).
func reachable(w *state.Workload, network string, svc *state.Service) bool {
	if w.Network != network || len(w.Addresses) == 0 || w.HostNetwork || w.Capacity == 0 {
		return false
	}
	return w.Healthy || svc != nil && svc.LoadBalancing != nil && svc.LoadBalancing.HealthPolicy == state.AllowAll
}

// servesPort: the endpoint maps port to a target port (its own mapping,
// else the service's numeric target port).
func servesPort(ep *state.Endpoint, svc *state.Service, port uint16) bool {
	for _, pm := range ep.Ports {
		if pm.ServicePort == port && pm.TargetPort != 0 {
			return true
		}
	}
	t, _ := svc.TargetPort(port)
	return t != 0
}

// pick draws one eligible endpoint weighted by capacity; nil if none.
func pick(eps []state.Endpoint, rnd func(int) int, eligible func(*state.Endpoint) bool) *state.Workload {
	var total uint64
	for i := range eps {
		if eligible(&eps[i]) {
			total += uint64(eps[i].Workload.Capacity)
		}
	}
	if total == 0 {
		return nil
	}
	r := uint64(rnd(int(total)))
	for i := range eps {
		if !eligible(&eps[i]) {
			continue
		}
		c := uint64(eps[i].Workload.Capacity)
		if r < c {
			return eps[i].Workload
		}
		r -= c
	}
	return nil
}
