package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

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
)

// serveHBONE is the 15008 handler (docs/protocol.md#hbone, #routing): it
// validates the authority, finds the local workload, authorizes, and dials
// the application before answering 200. Every outcome is
// recorded once.
func (p *WorkloadProxy) serveHBONE(ctx context.Context, req *hbone.Request) hbone.Reply {
	src := addrPortOf(req.RemoteAddr)
	arrival := addrPortOf(req.LocalAddr)
	target := netip.AddrPortFrom(req.Authority.Addr().Unmap(), req.Authority.Port())
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
	if svc := forwardedService(snap, local, req.Forwarded); svc != nil {
		res.Service = serviceOf(svc)
	}

	if target.Addr() != arrival.Addr() && !servesAsWaypoint(snap, local, target) {
		return refuse(400, WithReason(ReasonBadRequest, fmt.Errorf("proxy: authority %s, arrived on %s: %w", target, arrival, errAuthorityMismatch)))
	}
	if route.IsProxyPort(target.Port()) {
		return refuse(503, WithReason(ReasonSelfCall, fmt.Errorf("proxy: authority %s: %w", target, route.ErrIllegalPort)))
	}
	// The app is reached on this pod's IP; a sandwiched waypoint addressed
	// by a service VIP takes the traffic on its application-tunnel port.
	upstream := netip.AddrPortFrom(arrival.Addr(), target.Port())
	if at := local.ApplicationTunnel; at != nil && at.Port != 0 && target.Addr() != arrival.Addr() {
		upstream = netip.AddrPortFrom(arrival.Addr(), at.Port)
	}
	conn := rbac.Conn{SrcIP: src.Addr(), DstIP: upstream.Addr(), DstPort: upstream.Port(), SrcIdentity: req.Peer}
	if err := p.authorize(snap, local, conn); err != nil {
		return refuse(401, err)
	}
	up, err := p.dialApp(ctx, src.Addr(), upstream)
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

// servesAsWaypoint reports whether local is the waypoint of the service or
// workload at target (sandwich: the authority may then be that VIP or
// workload IP instead of the arrival address).
func servesAsWaypoint(snap *state.Snapshot, local *state.Workload, target netip.AddrPort) bool {
	if svc := snap.ServiceByVIP(local.Network, target.Addr(), local.Namespace); svc != nil {
		return gatewayIs(snap, svc.Waypoint, local)
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
		return w.PortsFor(g.Hostname.Key()) != nil
	}
	if hasAddr(w, g.Address.IP) {
		return true
	}
	if svc := snap.ServiceByVIP(g.Address.Network, g.Address.IP, ""); svc != nil {
		return w.PortsFor(svc.Key) != nil
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
