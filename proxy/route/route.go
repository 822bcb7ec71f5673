package route

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// Ports the node proxy listens on inside each pod (docs/protocol.md#ports).
const (
	OutboundPort         = 15001
	InboundPlaintextPort = 15006
	HBONEPort            = 15008
)

// IsProxyPort reports whether port is one of our own listener ports: a
// connection whose final destination is one of them would loop through the
// proxy ("attempted recursive call").
func IsProxyPort(port uint16) bool {
	return port == OutboundPort || port == InboundPlaintextPort || port == HBONEPort
}

// Routing errors. Outbound returns them wrapped with the destination; callers
// branch with errors.Is.
var (
	// ErrIllegalPort: the destination is the proxy's own port on loopback
	// (outbound) or the target port is one of its ports (inbound).
	ErrIllegalPort = errors.New("attempted recursive call to a proxy port")
	// ErrNoHealthyUpstream: the destination is a service VIP but no endpoint
	// can take the connection (none, none healthy, or none serving the port).
	ErrNoHealthyUpstream = errors.New("no healthy upstream")
	// ErrUnknownWaypoint: the destination has a waypoint that the snapshot
	// cannot resolve to a workload.
	ErrUnknownWaypoint = errors.New("waypoint not found")
	// ErrUnsupported: the upstream needs a feature this proxy lacks (a
	// waypoint known by hostname only).
	ErrUnsupported = errors.New("unsupported upstream")
	// ErrOtherNetwork: the upstream is on another network than the source
	// and cannot be reached from here: it has no network gateway, the
	// gateway is unknown, or the destination was not addressed by service
	// (double HBONE names the service). Never a direct dial.
	ErrOtherNetwork = errors.New("upstream on another network is not reachable")
)

// Kind is how an outbound connection leaves the pod.
type Kind uint8

// Route kinds.
const (
	// Passthrough: plain TCP from the pod straight to the original
	// destination, which the mesh does not know.
	Passthrough Kind = iota
	// Direct: plain TCP to a known non-HBONE workload: a
	// load-balanced service endpoint (podIP:targetPort) or the workload the
	// client addressed (the original destination).
	Direct
	// HBONE: HTTP/2 CONNECT over mTLS to NextHop with Authority.
	HBONE
	// DoubleHBONE: HBONE inside HBONE to a workload on another network
	// (Istio's multi-network ambient): an outer CONNECT to the network
	// gateway at NextHop, and over that stream a new mTLS connection to
	// the final destination with the inner CONNECT; both name
	// AuthorityHost:Authority.Port(), the service.
	DoubleHBONE
)

func (k Kind) String() string {
	switch k {
	case Direct:
		return "direct"
	case HBONE:
		return "hbone"
	case DoubleHBONE:
		return "double-hbone"
	}
	return "passthrough"
}

// Decision is the outbound routing decision for one connection, what
// Outbound returns: the 15001 listener carries it out and looks nothing up
// again.
// Its pointers are shared with the snapshot it was computed from and must
// not be modified.
type Decision struct {
	// Kind says how to connect.
	Kind Kind
	// NextHop is the L4 address to dial: ip:15008 (the waypoint's or the
	// destination pod's) for HBONE, podIP:targetPort for Direct, the
	// original destination for Passthrough, the network gateway's
	// ip:port for DoubleHBONE.
	NextHop netip.AddrPort
	// Authority is the CONNECT :authority (HBONE only; zero otherwise):
	// podIP:targetPort to a pod, the original destination (VIP:port or
	// podIP:port as dialled) through a waypoint. For DoubleHBONE only its
	// port counts (the service port the client dialled; the Addr is zero)
	// and AuthorityHost names the host.
	Authority netip.AddrPort
	// AuthorityHost is the hostname of both CONNECTs of DoubleHBONE: the
	// intended service's hostname, also through a remote waypoint (as
	// Istio's ztunnel sends). "" for every other kind.
	AuthorityHost string
	// UpstreamIdentity is the identity the HBONE server at NextHop must
	// present: the destination workload's, the waypoint workload's, or
	// for DoubleHBONE the network gateway workload's. Zero unless HBONE or
	// DoubleHBONE.
	UpstreamIdentity identity.Identity
	// UpstreamSANs are further acceptable server identities: the intended
	// service's SubjectAltNames (the waypoint service's for a waypoint, the
	// gateway service's for DoubleHBONE). The slice is the snapshot's and
	// read-only; nil when none.
	UpstreamSANs []identity.Identity
	// FinalIdentity and FinalSANs are what the inner TLS server of
	// DoubleHBONE must present (one of them): DstWorkload's identity and
	// the SubjectAltNames of the service it was selected from (the waypoint
	// service's for a remote waypoint). The gateway may balance the inner
	// connection to another endpoint of the service, which then needs the
	// same identity or one of the SANs. Zero and nil for other kinds.
	FinalIdentity identity.Identity
	FinalSANs     []identity.Identity
	// Gateway is the network gateway workload NextHop belongs to
	// (DoubleHBONE only; nil otherwise).
	Gateway *state.Workload
	// Service is the service the client addressed (its VIP), nil when it
	// addressed a workload or something unknown. Metrics and the
	// forwarded header name it.
	Service *state.Service
	// DstWorkload is the workload the connection terminates at: the
	// selected endpoint, the addressed workload, or the waypoint (for
	// DoubleHBONE the remote one, behind Gateway); nil for Passthrough.
	DstWorkload *state.Workload
	// Waypoint is true when NextHop is the destination's waypoint.
	Waypoint bool
	// Hostname, when set, is the DNS name of DstWorkload (a ServiceEntry
	// endpoint with resolution DNS): the listener resolves it, picks one of
	// the answers (of the original destination's family first) and dials
	// answer:NextHop.Port() (Direct) or answer:15008 with authority
	// answer:TargetPort (HBONE). NextHop's address is then the zero Addr.
	Hostname string
	// TargetPort is the port to reach Hostname on (HBONE authority's
	// port); zero unless Hostname is set.
	TargetPort uint16
}

// UpstreamIdentities returns the acceptable server identities in order,
// UpstreamIdentity first, as the HBONE pool key wants them. It allocates;
// call it once per connection, when dialling.
func (r *Decision) UpstreamIdentities() []identity.Identity {
	return identities(r.UpstreamIdentity, r.UpstreamSANs)
}

// FinalIdentities returns the acceptable identities of DoubleHBONE's inner
// TLS server in order, FinalIdentity first; nil for other kinds. It
// allocates.
func (r *Decision) FinalIdentities() []identity.Identity {
	return identities(r.FinalIdentity, r.FinalSANs)
}

func identities(first identity.Identity, rest []identity.Identity) []identity.Identity {
	if first.IsZero() {
		return nil
	}
	ids := make([]identity.Identity, 0, 1+len(rest))
	ids = append(ids, first)
	for _, s := range rest {
		if s != first {
			ids = append(ids, s)
		}
	}
	return ids
}

// Outbound decides how the pod src's connection to origDst leaves the pod
// (docs/protocol.md#routing), reading only snap. src may be nil (an unknown
// source: no load-balancing preference, no waypoint exemption). It does
// not allocate on success.
//
//  1. Loopback to one of the proxy's ports: ErrIllegalPort.
//  2. A service VIP (on src's network, preferring src's namespace) whose
//     service has a waypoint that is not src: HBONE to the waypoint,
//     authority origDst. With weighted waypoints one is drawn per
//     connection by weight (see serviceWaypoint); src being any of them
//     counts as src.
//  3. A service VIP otherwise: a PASSTHROUGH service (a ServiceEntry with
//     resolution NONE) gets Passthrough to origDst with the service named;
//     else an endpoint is load-balanced; none means ErrNoHealthyUpstream.
//     HBONE endpoints get HBONE to podIP:15008 with authority
//     podIP:targetPort, others Direct TCP to podIP:targetPort; an endpoint
//     known by hostname only (resolution DNS) gets the same with Hostname
//     set, for the listener to resolve.
//  4. A workload IP: through the workload's waypoint if it has one that is
//     not src (authority origDst), else HBONE to podIP:15008 with authority
//     origDst, or Direct TCP to origDst for a non-HBONE workload.
//  5. Anything else: Passthrough to origDst.
//
// In 2 and 3, a waypoint or endpoint on another network than src's is
// reached only through its network gateway: DoubleHBONE (see
// crossNetwork); without a usable gateway, ErrOtherNetwork. A workload
// IP (4) is looked up on src's network only, and its waypoint on another
// network is ErrOtherNetwork (double HBONE names a service).
//
// Which service a VIP names is snap.ServiceByVIP's answer: an exact VIP
// first, then a workload's own IP, and a ServiceEntry range only for an
// address no workload, node or exact VIP holds. So a tenant's range
// (0.0.0.0/0 with a waypoint, say) never diverts pod-to-pod traffic, even
// though step 2 runs before step 4.
func Outbound(snap *state.Snapshot, src *state.Workload, origDst netip.AddrPort) (Decision, error) {
	return OutboundWith(snap, src, origDst, nil)
}

// OutboundWith is Outbound with the random source for endpoint selection: rnd(n)
// returns a number in [0, n); nil means math/rand/v2.IntN. Tests pass a
// fixed one.
func OutboundWith(snap *state.Snapshot, src *state.Workload, origDst netip.AddrPort, rnd func(int) int) (Decision, error) {
	dst := netip.AddrPortFrom(origDst.Addr().Unmap(), origDst.Port())
	if dst.Addr().IsLoopback() && IsProxyPort(dst.Port()) {
		return Decision{}, fmt.Errorf("proxy: route to %s: %w", dst, ErrIllegalPort)
	}
	network, ns := "", ""
	if src != nil {
		network, ns = src.Network, src.Namespace
	}

	if svc := snap.ServiceByVIP(network, dst.Addr(), ns); svc != nil {
		if g := serviceWaypoint(svc, rnd); g != nil && !isWaypointOf(snap, svc, src) {
			wp, wsvc, err := resolveGateway(snap, src, g, rnd)
			if err != nil {
				return Decision{}, fmt.Errorf("proxy: route to %s (service %s): %w", dst, svc.Hostname, err)
			}
			if !isSelf(src, wp) {
				if onOtherNetwork(src, wp) {
					var sans []identity.Identity
					if wsvc != nil {
						sans = wsvc.SubjectAltNames
					}
					r, err := crossNetwork(snap, src, wp, sans, svc, dst, rnd)
					r.Waypoint = err == nil
					return r, err
				}
				return waypointRoute(wp, wsvc, g, svc, dst)
			}
		}
		if lb := svc.LoadBalancing; lb != nil && lb.Mode == state.LBModePassthrough {
			// Istio's resolution NONE: the mesh knows the destination's
			// service, not its endpoints; go where the client went.
			return Decision{Kind: Passthrough, NextHop: dst, Service: svc}, nil
		}
		w, port, err := snap.SelectEndpoint(svc, dst.Port(), src, rnd)
		if err != nil {
			return Decision{}, fmt.Errorf("proxy: route to %s (service %s): %w: %w", dst, svc.Hostname, ErrNoHealthyUpstream, err)
		}
		if onOtherNetwork(src, w) {
			return crossNetwork(snap, src, w, svc.SubjectAltNames, svc, dst, rnd)
		}
		ip, ok := AddrLike(w, dst.Addr())
		if !ok {
			if len(w.Addresses) == 0 && w.Hostname != "" && w.NetworkGateway == nil {
				return hostnameRoute(w, svc, port), nil
			}
			return Decision{}, unsupported(dst, w)
		}
		target := netip.AddrPortFrom(ip, port)
		if w.Protocol != state.TunnelHBONE {
			return Decision{Kind: Direct, NextHop: target, Service: svc, DstWorkload: w}, nil
		}
		return Decision{
			Kind:             HBONE,
			NextHop:          netip.AddrPortFrom(ip, HBONEPort),
			Authority:        target,
			UpstreamIdentity: w.Identity(),
			UpstreamSANs:     svc.SubjectAltNames,
			Service:          svc,
			DstWorkload:      w,
		}, nil
	}

	if w := snap.WorkloadByIP(network, dst.Addr()); w != nil {
		if g := w.Waypoint; g != nil {
			wp, wsvc, err := resolveGateway(snap, src, g, rnd)
			if err != nil {
				return Decision{}, fmt.Errorf("proxy: route to %s (workload %s/%s): %w", dst, w.Namespace, w.Name, err)
			}
			if !isSelf(src, wp) {
				if onOtherNetwork(src, wp) {
					return Decision{}, fmt.Errorf("proxy: route to %s (workload %s/%s) via waypoint %s/%s on network %q: %w: double HBONE needs a service-addressed destination",
						dst, w.Namespace, w.Name, wp.Namespace, wp.Name, wp.Network, ErrOtherNetwork)
				}
				return waypointRoute(wp, wsvc, g, nil, dst)
			}
		}
		if w.Protocol != state.TunnelHBONE {
			return Decision{Kind: Direct, NextHop: dst, DstWorkload: w}, nil
		}
		return Decision{
			Kind:             HBONE,
			NextHop:          netip.AddrPortFrom(dst.Addr(), HBONEPort),
			Authority:        dst,
			UpstreamIdentity: w.Identity(),
			DstWorkload:      w,
		}, nil
	}
	return Decision{Kind: Passthrough, NextHop: dst}, nil
}

func waypointRoute(wp *state.Workload, wsvc *state.Service, g *state.GatewayAddress, svc *state.Service, dst netip.AddrPort) (Decision, error) {
	ip, ok := AddrLike(wp, dst.Addr())
	if !ok {
		return Decision{}, unsupported(dst, wp)
	}
	port := g.Port()
	r := Decision{
		Kind:             HBONE,
		NextHop:          netip.AddrPortFrom(ip, port),
		Authority:        dst,
		UpstreamIdentity: wp.Identity(),
		Service:          svc,
		DstWorkload:      wp,
		Waypoint:         true,
	}
	if wsvc != nil {
		r.UpstreamSANs = wsvc.SubjectAltNames
	}
	return r, nil
}

// hostnameRoute is the decision for an endpoint known by DNS name only.
func hostnameRoute(w *state.Workload, svc *state.Service, port uint16) Decision {
	r := Decision{
		Kind:        Direct,
		NextHop:     netip.AddrPortFrom(netip.Addr{}, port),
		Service:     svc,
		DstWorkload: w,
		Hostname:    w.Hostname,
		TargetPort:  port,
	}
	if w.Protocol == state.TunnelHBONE {
		r.Kind = HBONE
		r.NextHop = netip.AddrPortFrom(netip.Addr{}, HBONEPort)
		r.UpstreamIdentity = w.Identity()
		r.UpstreamSANs = svc.SubjectAltNames
	}
	return r
}

// Resolved returns the decision with Hostname's answer ip filled in:
// NextHop ip:port (and Authority ip:TargetPort for HBONE), Hostname
// cleared.
func (r Decision) Resolved(ip netip.Addr) Decision {
	r.NextHop = netip.AddrPortFrom(ip, r.NextHop.Port())
	if r.Kind == HBONE {
		r.Authority = netip.AddrPortFrom(ip, r.TargetPort)
	}
	r.Hostname, r.TargetPort = "", 0
	return r
}

func unsupported(dst netip.AddrPort, w *state.Workload) error {
	what := "no address of a usable family"
	if len(w.Addresses) == 0 && w.Hostname != "" {
		what = "workload known by hostname only, as a waypoint"
	}
	return fmt.Errorf("proxy: route to %s via %s/%s: %w: %s", dst, w.Namespace, w.Name, ErrUnsupported, what)
}

// onOtherNetwork reports whether w is reachable from src only through a
// network gateway: it is on another network than src's, or (no source
// known) it has no address but a gateway.
func onOtherNetwork(src, w *state.Workload) bool {
	if src != nil {
		return w.Network != src.Network
	}
	return len(w.Addresses) == 0 && w.Hostname == "" && w.NetworkGateway != nil
}

// crossNetwork is the DoubleHBONE decision to w (an endpoint of svc, or
// svc's waypoint) on another network, as Istio's ztunnel builds it
// (build_request_through_gateway): the outer tunnel to w's network gateway
// verifying the gateway, the inner one verifying w or finalSANs (the
// service w was selected from), both with authority svc.Hostname and the
// service port dst carries.
func crossNetwork(snap *state.Snapshot, src, w *state.Workload, finalSANs []identity.Identity, svc *state.Service,
	dst netip.AddrPort, rnd func(int) int) (Decision, error) {
	g := w.NetworkGateway
	if g == nil {
		return Decision{}, fmt.Errorf("proxy: route to %s (service %s) via %s/%s on network %q: %w: it has no network gateway",
			dst, svc.Hostname, w.Namespace, w.Name, w.Network, ErrOtherNetwork)
	}
	gw, gsvc, hop, err := resolveNetworkGateway(snap, src, g, dst.Addr(), rnd)
	if err != nil {
		return Decision{}, fmt.Errorf("proxy: route to %s (service %s) via %s/%s on network %q: %w: %w",
			dst, svc.Hostname, w.Namespace, w.Name, w.Network, ErrOtherNetwork, err)
	}
	r := Decision{
		Kind:             DoubleHBONE,
		NextHop:          hop,
		Authority:        netip.AddrPortFrom(netip.Addr{}, dst.Port()),
		AuthorityHost:    svc.Hostname,
		UpstreamIdentity: gw.Identity(),
		FinalIdentity:    w.Identity(),
		FinalSANs:        finalSANs,
		Gateway:          gw,
		Service:          svc,
		DstWorkload:      w,
	}
	if gsvc != nil {
		r.UpstreamSANs = gsvc.SubjectAltNames
	}
	return r, nil
}

// resolveNetworkGateway finds the gateway workload and the address to dial
// for the network gateway g (Istio's fetch_network_gateway): by service
// hostname, an endpoint of that service load-balanced on the HBONE port
// (dialled at its target port, of like's family first); by IP, the
// workload owning it (dialled at the HBONE port), else an endpoint of the
// service with that VIP. The service is returned when known, for its SANs.
func resolveNetworkGateway(snap *state.Snapshot, src *state.Workload, g *state.GatewayAddress, like netip.Addr,
	rnd func(int) int) (*state.Workload, *state.Service, netip.AddrPort, error) {
	port := g.Port()
	var svc *state.Service
	if g.IsHostname() {
		svc = snap.ServiceForGateway(g)
		if svc == nil {
			return nil, nil, netip.AddrPort{}, fmt.Errorf("network gateway service %s/%s unknown", g.Hostname.Namespace, g.Hostname.Hostname)
		}
	} else {
		if w := snap.WorkloadByIP(g.Address.Network, g.Address.IP); w != nil {
			return w, nil, netip.AddrPortFrom(g.Address.IP, port), nil
		}
		svc = snap.ServiceByVIP(g.Address.Network, g.Address.IP, "")
		if svc == nil {
			return nil, nil, netip.AddrPort{}, fmt.Errorf("network gateway %s on network %q unknown", g.Address.IP, g.Address.Network)
		}
		like = g.Address.IP
	}
	w, tport, err := snap.SelectGatewayEndpoint(svc, port, src, rnd)
	if err != nil {
		return nil, nil, netip.AddrPort{}, fmt.Errorf("network gateway service %s port %d: %w", svc.Hostname, port, err)
	}
	ip, ok := AddrLike(w, like)
	if !ok {
		return nil, nil, netip.AddrPort{}, fmt.Errorf("network gateway %s/%s has no address", w.Namespace, w.Name)
	}
	return w, svc, netip.AddrPortFrom(ip, tport), nil
}

// resolveGateway finds the workload behind a waypoint address: by service
// hostname (an endpoint load-balanced on the HBONE port), or by IP (a
// workload, else a service VIP). The service is returned when known, for
// its SANs.
func resolveGateway(snap *state.Snapshot, src *state.Workload, g *state.GatewayAddress, rnd func(int) int) (*state.Workload, *state.Service, error) {
	port := g.Port()
	var svc *state.Service
	if g.IsHostname() {
		svc = snap.ServiceForGateway(g)
		if svc == nil {
			return nil, nil, fmt.Errorf("%w: service %s/%s unknown", ErrUnknownWaypoint, g.Hostname.Namespace, g.Hostname.Hostname)
		}
	} else {
		if w := snap.WorkloadByIP(g.Address.Network, g.Address.IP); w != nil {
			return w, nil, nil
		}
		svc = snap.ServiceByVIP(g.Address.Network, g.Address.IP, "")
		if svc == nil {
			return nil, nil, fmt.Errorf("%w: address %s unknown", ErrUnknownWaypoint, g.Address.IP)
		}
	}
	w, _, err := snap.SelectEndpoint(svc, port, src, rnd)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: service %s: %w", ErrUnknownWaypoint, svc.Hostname, err)
	}
	return w, svc, nil
}

// serviceWaypoint picks the waypoint of one connection to svc. With
// WeightedWaypoints (Istio 1.31 canary waypoints) it draws one entry with
// probability weight/sum(weights), so weight 0 never wins; when the list is
// empty or every weight is 0 it is the primary Waypoint, as Istio's ztunnel
// falls back. nil means the service has no waypoint. The draw is per
// connection, not sticky: a client's connections spread over the set.
//
// A drawn waypoint that the snapshot cannot resolve fails the connection
// (ErrUnknownWaypoint from resolveGateway) rather than trying another entry
// or the endpoints directly: the weights are the operator's statement of
// where this traffic's L7 policy runs, and bypassing the waypoint would skip
// it (fail closed, as upstream does).
func serviceWaypoint(svc *state.Service, rnd func(int) int) *state.GatewayAddress {
	ww := svc.WeightedWaypoints
	if len(ww) == 0 {
		return svc.Waypoint
	}
	var total uint64
	for i := range ww {
		total += uint64(ww[i].Weight)
	}
	if total == 0 {
		return svc.Waypoint
	}
	// total is at most 2^32 * len(ww); it fits an int on 64-bit platforms,
	// the only ones this proxy builds for (netns, splice).
	n := uint64(intn(rnd, int(total)))
	for i := range ww {
		w := uint64(ww[i].Weight)
		if n < w {
			return &ww[i].Destination
		}
		n -= w
	}
	return &ww[len(ww)-1].Destination // unreachable: n < total
}

func intn(rnd func(int) int, n int) int {
	if rnd == nil {
		return rand.IntN(n)
	}
	return rnd(n)
}

// isSelf reports whether the source is the waypoint itself (a sandwiched
// waypoint sending on to the destination must not loop back to itself).
func isSelf(src, wp *state.Workload) bool {
	return src != nil && wp != nil && src.UID == wp.UID
}

// AddrLike picks w's address of like's family, else its first address.
func AddrLike(w *state.Workload, like netip.Addr) (netip.Addr, bool) {
	for _, a := range w.Addresses {
		if a.Is4() == like.Is4() {
			return a, true
		}
	}
	if len(w.Addresses) > 0 {
		return w.Addresses[0], true
	}
	return netip.Addr{}, false
}
