package route

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// Inbound errors: why a pod's node proxy refuses an HBONE CONNECT before
// authorization. Inbound returns them wrapped with the authority; callers
// branch with errors.Is (the node proxy answers 400 for
// ErrAuthorityMismatch, 503 for the others and for ErrIllegalPort).
var (
	// ErrAuthorityMismatch: the authority names another IP than the one the
	// connection arrived on, and this pod is not its waypoint.
	ErrAuthorityMismatch = errors.New("authority does not match the address the connection arrived on")
	// ErrUnknownHostname: a hostname authority names no service.
	ErrUnknownHostname = errors.New("no service has this hostname")
	// ErrNotLocalHostname: services of that hostname exist, but this pod is
	// neither an endpoint nor the waypoint of any of them.
	ErrNotLocalHostname = errors.New("this workload is not an endpoint or the waypoint of a service of this hostname")
	// ErrNoTargetPort: the service port maps to no target port for this
	// workload (not declared, or a named port it does not resolve).
	ErrNoTargetPort = errors.New("service port has no target port on this workload")
)

// Arrival is where an inbound HBONE connection arrived: the pod (its
// workload) and the address it was accepted on (the pod's IP, port 15008).
type Arrival struct {
	Workload *state.Workload
	Addr     netip.AddrPort
}

// Authority is what a CONNECT's :authority names: an address, or a service
// hostname and a port (Host set: only Addr's port counts).
type Authority struct {
	Addr netip.AddrPort
	Host string
}

func (a Authority) String() string {
	if a.Host != "" {
		return fmt.Sprintf("%s:%d", a.Host, a.Addr.Port())
	}
	return a.Addr.String()
}

// Peer is the client of an inbound connection: its address and the
// identity its certificate proved (zero for plaintext).
type Peer struct {
	Addr     netip.AddrPort
	Identity identity.Identity
}

// InboundDecision is how a pod's node proxy takes one HBONE CONNECT, what
// Inbound returns: the 15008 handler authorizes Conn and dials Upstream
// without looking anything up again. Its pointers are the snapshot's.
type InboundDecision struct {
	// Target is where in the pod the authority lands: the authority itself,
	// or for a hostname the arrival address with the service's target port.
	Target netip.AddrPort
	// Service is the service a hostname authority resolved to (nil for an
	// address).
	Service *state.Service
	// Waypoint is true when the authority is another address, whose
	// waypoint this pod is (a sandwiched waypoint).
	Waypoint bool
	// Upstream is the application's address: the arrival IP and Target's
	// port, or the port of the pod's application tunnel.
	Upstream netip.AddrPort
	// Conn is what authorization evaluates (rbac.Evaluate with the pod's
	// policies): the peer to Upstream.
	Conn rbac.Conn
}

// Inbound decides how the pod at arrival takes a CONNECT for authority from
// peer (docs/protocol.md#hbone, #routing): a hostname authority must name a
// service this pod is an endpoint or the waypoint of (its own namespace's
// first) and a port the pod maps; an address authority must be the arrival
// address, unless this pod is the waypoint of what it names or has an
// application tunnel (which receives the authority and decides itself);
// the target and an application tunnel's port must not be the proxy's own.
// On error the decision holds what was resolved before the refusal.
func Inbound(snap *state.Snapshot, arrival Arrival, authority Authority, peer Peer) (InboundDecision, error) {
	local := arrival.Workload
	d := InboundDecision{Target: authority.Addr}
	if authority.Host != "" {
		svc, port, err := resolveHostTarget(snap, local, authority.Host, authority.Addr.Port())
		if err != nil {
			return d, fmt.Errorf("authority %s: %w", authority, err)
		}
		d.Service = svc
		d.Target = netip.AddrPortFrom(arrival.Addr.Addr(), port)
	}
	at := local.ApplicationTunnel
	if d.Target.Addr() != arrival.Addr.Addr() && at == nil {
		if !servesAsWaypoint(snap, local, d.Target) {
			return d, fmt.Errorf("authority %s, arrived on %s: %w", d.Target, arrival.Addr, ErrAuthorityMismatch)
		}
		d.Waypoint = true
	}
	if IsProxyPort(d.Target.Port()) {
		return d, fmt.Errorf("authority %s: %w", d.Target, ErrIllegalPort)
	}
	// The app is reached on this pod's IP; an application tunnel may name
	// its own port (a sandwiched waypoint's, e.g. 15088).
	d.Upstream = netip.AddrPortFrom(arrival.Addr.Addr(), d.Target.Port())
	if at != nil && at.Port != 0 {
		if IsProxyPort(at.Port) {
			return d, fmt.Errorf("application tunnel port %d: %w", at.Port, ErrIllegalPort)
		}
		d.Upstream = netip.AddrPortFrom(arrival.Addr.Addr(), at.Port)
	}
	d.Conn = rbac.Conn{SrcIP: peer.Addr.Addr(), DstIP: d.Upstream.Addr(), DstPort: d.Upstream.Port(), SrcIdentity: peer.Identity}
	return d, nil
}

// resolveHostTarget resolves a hostname authority on this pod: among the
// services of that hostname, one this pod is an endpoint (or the waypoint)
// of, preferring the pod's namespace; then the target port for
// servicePort, from the pod's own port map for the service (named ports),
// else the service's numeric target port.
func resolveHostTarget(snap *state.Snapshot, local *state.Workload, host string, servicePort uint16) (*state.Service, uint16, error) {
	svcs := snap.ServicesByHostname(host)
	if len(svcs) == 0 {
		return nil, 0, ErrUnknownHostname
	}
	var best *state.Service
	for _, svc := range svcs {
		if !memberOf(local, svc.Key) && !isWaypointOf(snap, svc, local) {
			continue
		}
		if best == nil || svc.Namespace == local.Namespace && best.Namespace != local.Namespace {
			best = svc
		}
	}
	if best == nil {
		return nil, 0, ErrNotLocalHostname
	}
	for _, pm := range local.PortsFor(best.Key) {
		if pm.ServicePort == servicePort && pm.TargetPort != 0 {
			return best, pm.TargetPort, nil
		}
	}
	if tp, ok := best.TargetPort(servicePort); ok && tp != 0 {
		return best, tp, nil
	}
	return nil, 0, fmt.Errorf("%w (service %s port %d)", ErrNoTargetPort, best.Key, servicePort)
}

// servesAsWaypoint reports whether local is the waypoint of the service or
// workload at target (sandwich: the authority may then be that VIP or
// workload IP instead of the arrival address).
func servesAsWaypoint(snap *state.Snapshot, local *state.Workload, target netip.AddrPort) bool {
	if svc := snap.ServiceByVIP(local.Network, target.Addr(), local.Namespace); svc != nil {
		return isWaypointOf(snap, svc, local)
	}
	if w := snap.WorkloadByIP(local.Network, target.Addr()); w != nil {
		return designates(snap, w.Waypoint, local)
	}
	return false
}

// The membership rules, one place for both directions: outbound skips a
// service's waypoint when the source is one of them (a sandwiched waypoint
// forwarding to the service must reach the endpoints, never a sibling
// waypoint of a canary set), inbound accepts an authority for what the pod
// is the waypoint of.

// isWaypointOf reports whether w is one of svc's waypoints: the primary or
// any weighted (canary) entry, weight 0 included. A nil w is none.
func isWaypointOf(snap *state.Snapshot, svc *state.Service, w *state.Workload) bool {
	if w == nil {
		return false
	}
	if designates(snap, svc.Waypoint, w) {
		return true
	}
	for i := range svc.WeightedWaypoints {
		if designates(snap, &svc.WeightedWaypoints[i].Destination, w) {
			return true
		}
	}
	return false
}

// designates reports whether the gateway address g names w: w is an
// endpoint of g's service, owns g's IP, or is an endpoint of the service
// with g's IP as VIP.
func designates(snap *state.Snapshot, g *state.GatewayAddress, w *state.Workload) bool {
	if g == nil {
		return false
	}
	if g.IsHostname() {
		return inService(w, g.Hostname.Namespace, g.Hostname.Hostname)
	}
	for _, a := range w.Addresses {
		if a == g.Address.IP {
			return true
		}
	}
	if svc := snap.ServiceByVIP(g.Address.Network, g.Address.IP, ""); svc != nil {
		return memberOf(w, svc.Key)
	}
	return false
}

// memberOf reports whether w is an endpoint of the service key.
func memberOf(w *state.Workload, key string) bool {
	for i := range w.Services {
		if w.Services[i].Service == key {
			return true
		}
	}
	return false
}

// inService reports whether w is an endpoint of the service with key
// "ns/host", without building the key (the route does not allocate).
func inService(w *state.Workload, ns, host string) bool {
	for i := range w.Services {
		k := w.Services[i].Service
		if len(k) == len(ns)+1+len(host) && k[len(ns)] == '/' && k[:len(ns)] == ns && k[len(ns)+1:] == host {
			return true
		}
	}
	return false
}
