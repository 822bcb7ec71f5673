package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel-go/proxy/route"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// Inbound HBONE errors, each mapped to a CONNECT status.
var (
	// errAuthorityMismatch (400): the authority names another IP than the
	// one the connection arrived on, and this pod is not its waypoint.
	errAuthorityMismatch = errors.New("authority does not match the address the connection arrived on")
	// errDraining (503): the pod's listeners are draining.
	errDraining = errors.New("the pod's proxy is draining")
	// errUnknownHostname (503): a hostname authority names no service.
	errUnknownHostname = errors.New("no service has this hostname")
	// errNotLocalHostname (503): services of that hostname exist, but this
	// pod is neither an endpoint nor the waypoint of any of them.
	errNotLocalHostname = errors.New("this workload is not an endpoint or the waypoint of a service of this hostname")
	// errNoTargetPort (503): the service port maps to no target port for
	// this workload (not declared, or a named port it does not resolve).
	errNoTargetPort = errors.New("service port has no target port on this workload")
	// errNoServiceIP (503): a PROXY tunnel for a hostname authority needs
	// an address of the service for the header, and it has none.
	errNoServiceIP = errors.New("service has no address for the PROXY header")
)

// serveHBONE is the 15008 handler (docs/protocol.md#hbone, #routing): it
// validates the authority (ip:port, or a service hostname:port it resolves
// to this pod), finds the local workload, authorizes, and dials the
// application before answering 200; for an application tunnel of
// protocol PROXY (a sandwiched waypoint) it dials loopback and writes a
// PROXY v2 header first. Every outcome is recorded once.
func (p *WorkloadProxy) serveHBONE(ctx context.Context, req *hbone.Request) hbone.Reply {
	src := addrPortOf(req.RemoteAddr)
	arrival := addrPortOf(req.LocalAddr)
	// authority is what the client asked for; target is where in this pod
	// it lands (the same, unless the authority is a hostname).
	authority := netip.AddrPortFrom(req.Authority.Addr().Unmap(), req.Authority.Port())
	target := authority
	res := NewResult(p.d.Metrics, p.access, Inbound, src, arrival)
	res.HBONEAddr = target
	res.MTLS = true
	res.Src.Identity = req.Peer

	done, ok := p.group.Track()
	refuse := func(status int, err error) hbone.Reply {
		res.Record(&err)
		done()
		return hbone.Reply{Status: status}
	}
	if !ok {
		return refuse(503, WithReason(ReasonConnectFailed, errDraining))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel)
	defer stop()

	snap, local, err := p.waitLocal(ctx)
	if err != nil {
		return refuse(503, WithReason(ReasonUnknownDest, err))
	}
	res.Dst = peerOf(local)
	res.Dst.Identity = local.Identity()
	if sw := snap.WorkloadByIP(local.Network, src.Addr()); sw != nil {
		id := res.Src.Identity
		res.Src = peerOf(sw)
		res.Src.Identity = id
	}
	var hostSvc *state.Service
	if req.Host != "" {
		svc, port, err := resolveHostTarget(snap, local, req.Host, authority.Port())
		if err != nil {
			return refuse(503, WithReason(ReasonUnknownDest, fmt.Errorf("proxy: authority %s:%d: %w", req.Host, authority.Port(), err)))
		}
		hostSvc = svc
		target = netip.AddrPortFrom(arrival.Addr(), port)
		res.HBONEAddr = target
		res.Service = serviceOf(svc)
	} else if svc := forwardedService(snap, local, req.Forwarded); svc != nil {
		res.Service = serviceOf(svc)
	}

	at := local.ApplicationTunnel
	// A workload with an application tunnel gets the authority in the
	// tunnel's metadata and decides itself, as upstream lets it.
	if target.Addr() != arrival.Addr() && at == nil && !servesAsWaypoint(snap, local, target) {
		return refuse(400, WithReason(ReasonBadRequest, fmt.Errorf("proxy: authority %s, arrived on %s: %w", target, arrival, errAuthorityMismatch)))
	}
	if route.IsProxyPort(target.Port()) {
		return refuse(503, WithReason(ReasonSelfCall, fmt.Errorf("proxy: authority %s: %w", target, route.ErrIllegalPort)))
	}
	// The app is reached on this pod's IP; an application tunnel may name
	// its own port (a sandwiched waypoint's, e.g. 15088).
	upstream := netip.AddrPortFrom(arrival.Addr(), target.Port())
	if at != nil && at.Port != 0 {
		if route.IsProxyPort(at.Port) {
			return refuse(503, WithReason(ReasonSelfCall, fmt.Errorf("proxy: application tunnel port %d: %w", at.Port, route.ErrIllegalPort)))
		}
		upstream = netip.AddrPortFrom(arrival.Addr(), at.Port)
	}
	conn := rbac.Conn{SrcIP: src.Addr(), DstIP: upstream.Addr(), DstPort: upstream.Port(), SrcIdentity: req.Peer}
	if err := p.authorize(snap, local, conn); err != nil {
		return refuse(401, err)
	}
	var up net.Conn
	if at != nil && at.Protocol == state.AppTunnelProxy {
		up, err = p.dialProxyTunnel(ctx, req, src, authority, hostSvc, local, upstream)
	} else {
		up, err = p.dialApp(ctx, src.Addr(), upstream)
	}
	if err != nil {
		return refuse(503, WithReason(ReasonConnectFailed, fmt.Errorf("proxy: connect to the app: %w", err)))
	}

	// From here the server owns up; kill and the force watcher close it to
	// end the tunnel early.
	var forced atomic.Bool
	var once sync.Once
	t := &tracked{conn: conn, kill: func() { once.Do(func() { up.Close() }) }}
	p.track(t, snap)
	if tc, ok := up.(*net.TCPConn); ok {
		// The HBONE server copies the tunnel; the app socket tells the
		// progress: acknowledged by the app (client → app), read from it.
		res.Counters.SetProbe(func() (int64, int64) { return tcpAcked(tc), tcpConsumed(tc) })
	}
	res.Opened()
	// p.ctx ends with the drain's force (or Close): a callback, not a
	// watcher goroutine per tunnel.
	stopForce := context.AfterFunc(p.ctx, func() {
		forced.Store(true)
		t.kill()
	})
	return hbone.Reply{
		Status:   200,
		Upstream: up,
		Done: func(st hbone.TunnelStats, err error) {
			stopForce()
			p.inbound.remove(t)
			res.Counters.Sent.Add(st.BytesReceived) // client → app
			res.Counters.Received.Add(st.BytesSent) // app → client
			err = t.endErr(normalClose(err), forced.Load())
			res.Record(&err)
			done()
		},
	}
}

// dialProxyTunnel connects to a PROXY application tunnel: on loopback
// from loopback (the pod's iptables and routing would treat a spoofed
// source or the pod IP differently; the original source travels in the
// header), then writes the PROXY v2 header: source the HBONE client,
// destination the authority (for a hostname authority a VIP of the
// service, on local's network and IPv4 first, with the service port, as
// PROXY carries no names), TLV 0xD0 the client's verified identity.
func (p *WorkloadProxy) dialProxyTunnel(ctx context.Context, req *hbone.Request, src, authority netip.AddrPort,
	hostSvc *state.Service, local *state.Workload, upstream netip.AddrPort) (net.Conn, error) {
	dst := authority
	if hostSvc != nil {
		vip, ok := serviceVIP(hostSvc, local.Network)
		if !ok {
			return nil, fmt.Errorf("proxy: PROXY header for %s: %w", hostSvc.Hostname, errNoServiceIP)
		}
		dst = netip.AddrPortFrom(vip, authority.Port())
	}
	var tlvs []ProxyV2TLV
	if !req.Peer.IsZero() {
		tlvs = append(tlvs, ProxyV2TLV{Type: ProxyV2TLVPeerIdentity, Value: []byte(req.Peer.String())})
	}
	hdr, err := AppendProxyV2(nil, src, dst, tlvs...)
	if err != nil {
		return nil, err
	}
	lo := netip.IPv6Loopback()
	if upstream.Addr().Is4() {
		lo = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	up, err := p.dialApp(ctx, netip.Addr{}, netip.AddrPortFrom(lo, upstream.Port()))
	if err != nil {
		return nil, err
	}
	_ = up.SetWriteDeadline(time.Now().Add(ConnectTimeout))
	if _, err := up.Write(hdr); err != nil {
		up.Close()
		return nil, fmt.Errorf("proxy: write the PROXY header to %s: %w", up.RemoteAddr(), err)
	}
	_ = up.SetWriteDeadline(time.Time{})
	return up, nil
}

// serviceVIP picks the service address a PROXY header names for it: one
// on network, IPv4 before IPv6; else any.
func serviceVIP(svc *state.Service, network string) (netip.Addr, bool) {
	var best netip.Addr
	score := -1
	for _, v := range svc.VIPs {
		s := 0
		if v.Network == network {
			s = 1
			if v.Prefix.Addr().Is4() {
				s = 2
			}
		}
		if s > score {
			best, score = v.Prefix.Addr(), s
		}
	}
	return best, score >= 0
}

// resolveHostTarget resolves a hostname authority on this pod: among the
// services of that hostname, one this pod is an endpoint (or the waypoint)
// of, preferring the pod's namespace; then the target port for
// servicePort, from the pod's own port map for the service (named ports),
// else the service's numeric target port.
func resolveHostTarget(snap *state.Snapshot, local *state.Workload, host string, servicePort uint16) (*state.Service, uint16, error) {
	svcs := snap.ServicesByHostname(host)
	if len(svcs) == 0 {
		return nil, 0, errUnknownHostname
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
		return nil, 0, errNotLocalHostname
	}
	for _, pm := range local.PortsFor(best.Key) {
		if pm.ServicePort == servicePort && pm.TargetPort != 0 {
			return best, pm.TargetPort, nil
		}
	}
	if tp, ok := best.TargetPort(servicePort); ok && tp != 0 {
		return best, tp, nil
	}
	return nil, 0, fmt.Errorf("%w (service %s port %d)", errNoTargetPort, best.Key, servicePort)
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

// isWaypointOf reports whether w is svc's waypoint: the primary or any
// weighted (canary) one.
func isWaypointOf(snap *state.Snapshot, svc *state.Service, w *state.Workload) bool {
	if gatewayIs(snap, svc.Waypoint, w) {
		return true
	}
	for i := range svc.WeightedWaypoints {
		if gatewayIs(snap, &svc.WeightedWaypoints[i].Destination, w) {
			return true
		}
	}
	return false
}

// servesAsWaypoint reports whether local is the waypoint of the service or
// workload at target (sandwich: the authority may then be that VIP or
// workload IP instead of the arrival address).
func servesAsWaypoint(snap *state.Snapshot, local *state.Workload, target netip.AddrPort) bool {
	if svc := snap.ServiceByVIP(local.Network, target.Addr(), local.Namespace); svc != nil {
		return isWaypointOf(snap, svc, local)
	}
	if w := snap.WorkloadByIP(local.Network, target.Addr()); w != nil {
		return gatewayIs(snap, w.Waypoint, local)
	}
	return false
}

// gatewayIs reports whether the gateway address g designates w: w is an
// endpoint of g's service, or owns g's IP, or is an endpoint of the
// service with g's IP as VIP.
func gatewayIs(snap *state.Snapshot, g *state.GatewayAddress, w *state.Workload) bool {
	if g == nil {
		return false
	}
	if g.IsHostname() {
		return memberOf(w, g.Hostname.Key())
	}
	if hasAddr(w, g.Address.IP) {
		return true
	}
	if svc := snap.ServiceByVIP(g.Address.Network, g.Address.IP, ""); svc != nil {
		return memberOf(w, svc.Key)
	}
	return false
}

// forwardedService is the service named by the forwarded header's host=,
// if local is one of its endpoints: the label value then comes from the
// control plane, never from the header itself.
func forwardedService(snap *state.Snapshot, local *state.Workload, forwarded string) *state.Service {
	host := hbone.ForwardedHost(forwarded)
	if host == "" {
		return nil
	}
	for _, svc := range snap.ServicesByHostname(host) {
		if local.PortsFor(svc.Key) != nil {
			return svc
		}
	}
	return nil
}
