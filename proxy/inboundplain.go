package proxy

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/ztunnel-go/ztunnel-go/proxy/route"

	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
)

// errNotLocal: a plaintext connection redirected to 15006 was not addressed
// to this pod.
var errNotLocal = errors.New("destination is not this pod")

// servePlaintext handles one connection redirected to 15006: plaintext
// from outside the mesh (docs/protocol.md#routing). It is authorized with no
// peer identity, so PeerAuthentication STRICT (a DENY on not_principals
// presence) refuses it. A refused connection is simply closed.
func (p *WorkloadProxy) servePlaintext(c net.Conn, done func()) {
	defer done()
	src := addrPortOf(c.RemoteAddr())
	dst := OriginalDst(c)
	res := NewResult(p.d.Metrics, p.access, Inbound, src, dst)
	res.Span = p.d.Tracer.Inbound("", res.Start)
	var err error
	defer func() { res.Record(&err) }()
	defer c.Close()

	if route.IsProxyPort(dst.Port()) {
		err = WithReason(ReasonSelfCall, fmt.Errorf("proxy: plaintext to %s: %w", dst, route.ErrIllegalPort))
		return
	}
	snap, local, werr := p.waitLocal(p.ctx)
	if werr != nil {
		err = WithReason(ReasonUnknownDest, werr)
		return
	}
	res.Dst = peerOf(local)
	res.Dst.Identity = local.Identity()
	if sw := snap.WorkloadByIP(local.Network, src.Addr()); sw != nil {
		res.Src = peerOf(sw) // no identity: nothing proves it
	}
	if !hasAddr(local, dst.Addr()) {
		err = WithReason(ReasonUnknownDest, fmt.Errorf("proxy: plaintext to %s: %w", dst, errNotLocal))
		return
	}
	conn := rbac.Conn{SrcIP: src.Addr(), DstIP: dst.Addr(), DstPort: dst.Port()}
	if err = p.authorize(snap, local, conn); err != nil {
		return
	}
	up, derr := p.dialApp(p.ctx, src.Addr(), dst)
	if derr != nil {
		err = WithReason(ReasonConnectFailed, fmt.Errorf("proxy: connect to the app: %w", derr))
		return
	}
	defer up.Close()
	var once sync.Once
	t := &tracked{conn: conn, kill: func() { once.Do(func() { c.Close(); up.Close() }) }}
	p.track(t, snap)
	defer p.inbound.remove(t)
	res.Opened()
	cerr := Bidirectional(c, up, &res.Counters, p.ctx)
	err = t.endErr(cerr, errors.Is(cerr, ErrForced))
}
