package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel-go/proxy/route"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// Inbound HBONE errors of the listener, each mapped to a CONNECT status;
// the authority's are route.Inbound's (inboundRefusal maps them).
var (
	// errDraining (503): the pod's listeners are draining.
	errDraining = errors.New("the pod's proxy is draining")
	// errNoServiceIP (503): a PROXY tunnel for a hostname authority needs
	// an address of the service for the header, and it has none.
	errNoServiceIP = errors.New("service has no address for the PROXY header")
)

// serveHBONE is the 15008 handler (docs/protocol.md#hbone, #routing): it
// finds the local workload, has route.Inbound validate the authority
// (ip:port, or a service hostname:port it resolves to this pod),
// authorizes, and dials the application before answering 200; for an
// application tunnel of protocol PROXY (a sandwiched waypoint) it dials
// loopback and writes a PROXY v2 header first. Every outcome is recorded
// once.
func (p *WorkloadProxy) serveHBONE(ctx context.Context, req *hbone.Request) hbone.Reply {
	src := addrPortOf(req.RemoteAddr)
	arrival := addrPortOf(req.LocalAddr)
	// authority is what the client asked for; the decision's target is
	// where in this pod it lands (the same, unless the authority is a
	// hostname).
	authority := netip.AddrPortFrom(req.Authority.Addr().Unmap(), req.Authority.Port())
	res := NewResult(p.d.Metrics, p.access, Inbound, src, arrival)
	res.Span = p.d.Tracer.Inbound(req.Traceparent, res.Start)
	res.HBONEAddr = authority
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
	// Through a network gateway (double HBONE) the TCP peer is the gateway
	// and the client is on another network: its address names nobody
	// here, only the identity the inner mTLS proved counts (Istio's
	// from_gateway).
	fromGateway := req.HasForwardedNetwork && !strings.EqualFold(req.ForwardedNetwork, local.Network)
	if sw := snap.WorkloadByIP(local.Network, src.Addr()); sw != nil && !fromGateway {
		id := res.Src.Identity
		res.Src = peerOf(sw)
		res.Src.Identity = id
	} else if fromGateway {
		// What can be said of a client on another network: its namespace,
		// from its certificate, and its cluster as Istio's baggage names
		// it, only when that is a cluster this node's state knows (the
		// client's word must not mint label values).
		res.Src.Namespace = req.Peer.Namespace
		if b := hbone.ParseBaggage(req.Baggage); snap.KnownCluster(b.ClusterName) {
			res.Src.Cluster = b.ClusterName
		}
	}
	d, err := route.Inbound(snap, route.Arrival{Workload: local, Addr: arrival}, route.Authority{Addr: authority, Host: req.Host},
		route.Peer{Addr: src, Identity: req.Peer})
	res.HBONEAddr = d.Target
	if d.Service != nil {
		res.Service = serviceOf(d.Service)
	} else if req.Host == "" {
		if svc := forwardedService(snap, local, req.Forwarded); svc != nil {
			res.Service = serviceOf(svc)
		} else if svc := serviceByTargetPort(snap, local, d.Target.Port()); svc != nil {
			res.Service = serviceOf(svc)
		}
	}
	if err != nil {
		status, reason := inboundRefusal(err)
		return refuse(status, WithReason(reason, fmt.Errorf("proxy: %w", err)))
	}
	conn, upstream := d.Conn, d.Upstream
	if err := p.authorize(snap, local, conn); err != nil {
		return refuse(401, err)
	}
	at := local.ApplicationTunnel
	var up net.Conn
	if at != nil && at.Protocol == state.AppTunnelProxy {
		up, err = p.dialProxyTunnel(ctx, req, src, authority, d.Service, local, upstream)
	} else {
		up, err = p.dialApp(ctx, src.Addr(), upstream)
	}
	if err != nil {
		return refuse(503, WithReason(ReasonConnectFailed, fmt.Errorf("proxy: connect to the app: %w", err)))
	}

	// From here the server owns up; kill and the force watcher end the
	// tunnel early by aborting it, which wakes the splice (closing up alone
	// would not wake its readiness watch at once; the close is for a
	// Request without a tunnel).
	var forced atomic.Bool
	var once sync.Once
	t := &tracked{conn: conn, kill: func() { once.Do(func() { req.Abort(); up.Close() }) }}
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

// inboundRefusal is the CONNECT status and access-log reason of one of
// route.Inbound's errors.
func inboundRefusal(err error) (int, Reason) {
	switch {
	case errors.Is(err, route.ErrAuthorityMismatch):
		return 400, ReasonBadRequest
	case errors.Is(err, route.ErrIllegalPort):
		return 503, ReasonSelfCall
	}
	return 503, ReasonUnknownDest
}

// serviceByTargetPort guesses, for telemetry, the service a connection to
// port of local was for when the client did not say (a waypoint's pooled
// upstream connections carry no forwarded host): the first of local's
// services that maps a port to it, as Istio's ztunnel guesses
// (guess_inbound_service), so destination_service is the same.
func serviceByTargetPort(snap *state.Snapshot, local *state.Workload, port uint16) *state.Service {
	if port == 0 {
		return nil
	}
	for _, sp := range local.Services {
		for _, pm := range sp.Ports {
			if pm.TargetPort == port {
				if svc := snap.ServiceByHost(sp.Service); svc != nil {
					return svc
				}
			}
		}
	}
	return nil
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
