package proxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel-go/proxy/route"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// serveOutbound handles one connection the pod's capture rules redirected
// to 15001: original destination, one snapshot, Route, then HBONE through
// the pool or plain TCP from inside the pod, and one Result. An HBONE
// splice goes on without this goroutine: the Result is recorded and done
// called when it ends.
func (p *WorkloadProxy) serveOutbound(c net.Conn, done func()) {
	client := addrPortOf(c.RemoteAddr())
	orig := OriginalDst(c)
	res := NewResult(p.d.Metrics, p.access, Outbound, client, orig)
	res.Span = p.d.Tracer.Outbound(res.Start)
	finish := func(err error) {
		res.Record(&err)
		done()
	}

	snap, src, werr := p.waitLocal(p.ctx)
	if werr != nil {
		c.Close()
		finish(WithReason(ReasonUnknownSource, werr))
		return
	}
	res.Src = peerOf(src)
	rt, rerr := route.Outbound(snap, src, orig)
	if rerr == nil && rt.Hostname != "" {
		rt, rerr = p.resolveRoute(orig, rt)
	}
	if rerr != nil {
		c.Close()
		finish(routeReason(rerr))
		return
	}
	res.DstAddr = rt.NextHop
	res.Service = serviceOf(rt.Service)
	res.Dst = peerOf(rt.DstWorkload)

	switch rt.Kind {
	case route.HBONE:
		p.outboundHBONE(c, client, snap, src, &rt, res, finish)
		return
	case route.DoubleHBONE:
		p.outboundDoubleHBONE(c, client, src, &rt, res, finish)
		return
	}
	finish(p.outboundTCP(c, &rt, res))
}

// outboundTCP carries a connection as plain TCP from inside the pod. It
// owns c.
func (p *WorkloadProxy) outboundTCP(c net.Conn, rt *route.Decision, res *Result) error {
	defer c.Close()
	ctx, cancel := context.WithTimeout(p.ctx, ConnectTimeout)
	up, derr := p.ns.Dial(ctx, "tcp", rt.NextHop, netns.SockOpts{Mark: p.d.Config.PacketMark})
	cancel()
	if derr != nil {
		return WithReason(ReasonConnectFailed, derr)
	}
	defer up.Close()
	res.Opened()
	return Bidirectional(c, up, &res.Counters, p.ctx)
}

// outboundHBONE opens the tunnel and splices it with the client's
// connection. It owns c, and calls finish once with the outcome: now when
// no tunnel opened, else when the splice ends.
func (p *WorkloadProxy) outboundHBONE(c net.Conn, client netip.AddrPort, snap *state.Snapshot, src *state.Workload,
	rt *route.Decision, res *Result, finish func(error)) {
	srcID := src.Identity()
	res.MTLS = true
	res.HBONEAddr = rt.Authority
	res.Src.Identity = srcID
	res.Dst.Identity = rt.UpstreamIdentity
	req := connectRequest(src, srcID, client, rt)
	// The next proxy's connection span is this one's child.
	req.Traceparent = res.Span.Traceparent()
	ctx, cancel := context.WithTimeout(p.ctx, ConnectTimeout)
	t, err := p.pool.Connect(ctx, req)
	cancel()
	if err != nil {
		c.Close()
		finish(hboneReason(err))
		return
	}
	p.spliceTunnel(c, t, res, finish)
}

// connectRequest is the CONNECT that carries out rt (the outer one of a
// DoubleHBONE decision) for client, from src: to the next hop's
// identities, from src's address of the next hop's family.
func connectRequest(src *state.Workload, srcID identity.Identity, client netip.AddrPort, rt *route.Decision) *hbone.ConnectRequest {
	var srcIP netip.Addr
	if ip, ok := route.AddrLike(src, rt.NextHop.Addr()); ok {
		srcIP = ip
	}
	host := ""
	if rt.Service != nil {
		host = rt.Service.Hostname
	}
	return &hbone.ConnectRequest{
		Key: hbone.Key{
			Src:     srcID,
			Dst:     rt.UpstreamIdentities(),
			SrcIP:   srcIP,
			NextHop: rt.NextHop,
		},
		Authority: rt.Authority,
		Host:      rt.AuthorityHost,
		Baggage:   baggageOf(src).String(),
		Forwarded: hbone.BuildForwarded(client, host),
	}
}

// outboundDoubleHBONE carries out a DoubleHBONE decision (Istio's
// proxy_to_double_hbone): the outer CONNECT to the network gateway on a
// pooled connection, then inside it a connection of its own to the final
// destination with the inner CONNECT, which alone says where the client
// comes from (x-forwarded-network, baggage, forwarded, traceparent). The
// result names the final workload and service; dst.addr is the gateway.
// It owns c and calls finish once, as outboundHBONE.
func (p *WorkloadProxy) outboundDoubleHBONE(c net.Conn, client netip.AddrPort, src *state.Workload,
	rt *route.Decision, res *Result, finish func(error)) {
	srcID := src.Identity()
	res.MTLS = true
	res.HBONEAddr, res.HBONEHost = rt.Authority, rt.AuthorityHost
	res.Src.Identity = srcID
	res.Dst.Identity = rt.FinalIdentity
	outer := connectRequest(src, srcID, client, rt)
	inner := *outer
	inner.Key.Dst = rt.FinalIdentities()
	inner.ForwardedNetwork = src.Network
	// The final destination's connection span is this one's child; the
	// gateway's outer CONNECT gets a trace of its own, as upstream's does.
	inner.Traceparent = res.Span.Traceparent()
	ctx, cancel := context.WithTimeout(p.ctx, ConnectTimeout)
	t, err := p.pool.ConnectThrough(ctx, outer, &inner)
	cancel()
	if err != nil {
		c.Close()
		finish(hboneReason(err))
		return
	}
	res.Dst.Identity = t.PeerIdentity()
	if b := hbone.ParseBaggage(t.ResponseBaggage()); b.WorkloadName != "" &&
		(b.WorkloadName != res.Dst.Workload || b.Namespace != res.Dst.Namespace) &&
		b.Namespace == t.PeerIdentity().Namespace {
		// The gateway balanced to another endpoint than the one chosen
		// here: name the one that answered (Istio 1.29+ baggage). Only
		// within the namespace its certificate proves: the baggage is the
		// peer's word, and another namespace's names in this proxy's
		// series would be a claim nobody proved.
		res.Dst = Peer{
			Workload: b.WorkloadName, Namespace: b.Namespace, CanonicalService: b.ServiceName,
			CanonicalRevision: b.ServiceVersion, Cluster: b.ClusterName, Region: b.Region, Zone: b.Zone,
			Identity: t.PeerIdentity(),
		}
	}
	p.spliceTunnel(c, t, res, finish)
}

// spliceTunnel splices an open tunnel with the client's connection and
// counts it; it owns both, and calls finish when the splice has ended
// (no goroutine waits for that meanwhile: hbone.SpliceAsync).
func (p *WorkloadProxy) spliceTunnel(c net.Conn, t *hbone.Tunnel, res *Result, finish func(error)) {
	res.Counters.SetProbe(func() (int64, int64) { return t.BytesSent(), t.BytesReceived() })
	res.Opened()
	// p.ctx ends with the drain's force (or Close): a callback, not a
	// watcher goroutine per connection. Closing the tunnel ends the
	// splice, which closes c (closing c alone would not wake its watch).
	var forced atomic.Bool
	stop := context.AfterFunc(p.ctx, func() {
		forced.Store(true)
		t.Close()
	})
	hbone.SpliceAsync(t, c, func(err error) {
		stopped := stop()
		st := t.Stats()
		res.Counters.Sent.Add(st.BytesSent)
		res.Counters.Received.Add(st.BytesReceived)
		if !stopped && forced.Load() {
			finish(ErrForced)
			return
		}
		finish(normalClose(err))
	})
}

// errNoResolver: the route needs DNS and the proxy was given no resolver.
var errNoResolver = errors.New("no resolver for endpoints known by hostname")

// resolveRoute carries out a decision to an endpoint known by hostname: it
// resolves the name from inside the pod (cached by TTL) and picks one of
// the answers at random, of the original destination's family when there
// is one (IPv6 only when enabled). Failures are ErrNoHealthyUpstream.
func (p *WorkloadProxy) resolveRoute(orig netip.AddrPort, rt route.Decision) (route.Decision, error) {
	fail := func(err error) (route.Decision, error) {
		return route.Decision{}, fmt.Errorf("proxy: route to %s via %s: %w: %w", orig, rt.Hostname, route.ErrNoHealthyUpstream, err)
	}
	if p.d.Resolver == nil {
		return fail(errNoResolver)
	}
	ctx, cancel := context.WithTimeout(p.ctx, ConnectTimeout)
	defer cancel()
	addrs, err := p.d.Resolver.LookupHost(ctx, p.ns, rt.Hostname)
	if err != nil {
		return fail(err)
	}
	var like, other []netip.Addr
	for _, a := range addrs {
		switch {
		case a.Is6() && !p.d.Config.IPv6Enabled:
		case a.Is4() == orig.Addr().Unmap().Is4():
			like = append(like, a)
		default:
			other = append(other, a)
		}
	}
	if len(like) == 0 {
		like = other
	}
	if len(like) == 0 {
		return fail(fmt.Errorf("no usable address among %v", addrs))
	}
	return rt.Resolved(like[rand.IntN(len(like))]), nil
}

// routeReason attaches the Result reason to a routing error.
func routeReason(err error) error {
	switch {
	case errors.Is(err, route.ErrIllegalPort):
		return WithReason(ReasonSelfCall, err)
	case errors.Is(err, route.ErrNoHealthyUpstream), errors.Is(err, route.ErrUnknownWaypoint), errors.Is(err, route.ErrUnsupported),
		errors.Is(err, route.ErrOtherNetwork):
		return WithReason(ReasonNoHealthyUpstream, err)
	}
	return WithReason(ReasonInternal, err)
}

// hboneReason attaches the Result reason to a pool Connect error.
func hboneReason(err error) error {
	var se *hbone.StatusError
	switch {
	case errors.As(err, &se):
		if se.Code == 401 {
			return WithReason(ReasonPolicyDenied, fmt.Errorf("proxy: destination refused the tunnel: %w", err))
		}
		return WithReason(ReasonUpstreamStatus, err)
	case errors.Is(err, hbone.ErrIdentityMismatch):
		return WithReason(ReasonIdentity, err)
	case errors.Is(err, hbone.ErrHandshake):
		return WithReason(ReasonTLSFailure, err)
	}
	return WithReason(ReasonConnectFailed, err)
}

// baggageOf describes the source workload for the baggage header (control
// plane values only).
func baggageOf(w *state.Workload) hbone.Baggage {
	return hbone.Baggage{
		ClusterName:    w.ClusterID,
		Namespace:      w.Namespace,
		WorkloadType:   strings.ToLower(w.WorkloadType.String()),
		WorkloadName:   w.WorkloadName,
		ServiceName:    w.CanonicalName,
		ServiceVersion: w.CanonicalRevision,
		Region:         w.Locality.Region,
		Zone:           w.Locality.Zone,
	}
}
