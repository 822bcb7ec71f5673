package hbone

// Pool invariants:
//
//  1. A connection serves exactly one Key = (source identity, ordered list of
//     expected server identities, source IP, next hop). Different keys never
//     share a connection, so one workload's certificate never carries another
//     workload's traffic.
//  2. A connection carries at most min(MaxStreamsPerConn, the peer's
//     SETTINGS_MAX_CONCURRENT_STREAMS) streams. Slots are reserved under the
//     connection's lock (conn.reserve) before the HEADERS are written, so the
//     limit holds under any interleaving.
//  3. Streams go to the least-loaded usable connection of their key. When
//     every connection of a key carries SpreadStreams or more streams and
//     the key has fewer than SpreadConns connections, another is dialled in
//     the background while the stream proceeds on the least-loaded one; when
//     every connection is full, callers wait for a new one. There is no cap
//     on full connections, as in Istio's ztunnel.
//  4. At most one dial+handshake per key is in flight. Every caller that
//     needs it waits for that one dial and shares its result, error
//     included; a caller's context only ends its own wait. Dials run on the
//     pool's context with the connect timeout.
//  5. A connection with no streams closes after IdleTimeout. The decision is
//     taken under the connection's lock, which also guards reservations, so
//     a connection is never closed with a stream reserved on it. A
//     connection that is closing (idle expiry, GOAWAY, keepalive failure,
//     error) takes no new streams and removes itself from the pool.
//  6. Lock order: Pool.mu before conn.mu. Connection hooks run without
//     conn.mu and take Pool.mu. Connections are closed only after Pool.mu
//     is released.
//  7. Connections from Dial and the inner connections of ConnectThrough
//     (double HBONE) are never in the pool: the caller owns the former,
//     and an inner connection carries one stream and closes with it (its
//     outer stream is an ordinary pooled one).

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// PoolConfig configures a Pool. Zero fields take the documented defaults.
type PoolConfig struct {
	ClientConfig
	// Logger receives debug lines about connections ending; nil means none.
	Logger *zap.Logger
	// MaxStreamsPerConn caps streams per connection; 0 means 100.
	MaxStreamsPerConn int
	// SpreadStreams: when every connection of a key has at least this many
	// active streams, another connection is opened (up to SpreadConns);
	// 0 means 4.
	SpreadStreams int
	// SpreadConns caps the connections opened for spreading load (full
	// connections always get a successor); 0 means 4, negative means 1.
	SpreadConns int
	// IdleTimeout closes connections without streams; 0 means 5 minutes.
	IdleTimeout time.Duration
}

// Pool is a pool of outbound HBONE connections (one per local workload in
// in-pod mode). It is safe for concurrent use.
type Pool struct {
	cfg      PoolConfig
	log      *zap.Logger
	verified *verifyCache
	ctx      context.Context
	cancel   context.CancelFunc

	mu     sync.Mutex
	keys   map[poolKey]*keyConns
	closed bool
}

// poolKey is Key in comparable form; the common single-identity Dst list
// needs no allocation.
type poolKey struct {
	src     identity.Identity
	dst0    identity.Identity
	dstRest string
	srcIP   netip.Addr
	hop     netip.AddrPort
}

func makePoolKey(k *Key) poolKey {
	pk := poolKey{src: k.Src, srcIP: k.SrcIP, hop: k.NextHop}
	if len(k.Dst) > 0 {
		pk.dst0 = k.Dst[0]
	}
	if len(k.Dst) > 1 {
		var sb strings.Builder
		for _, d := range k.Dst[1:] {
			sb.WriteString(d.String())
			sb.WriteByte(' ')
		}
		pk.dstRest = sb.String()
	}
	return pk
}

type keyConns struct {
	pk    poolKey
	conns []*conn
	dial  *dialCall // in-flight dial, nil if none
}

type dialCall struct {
	done chan struct{}
	err  error // set before done is closed
}

// NewPool returns a pool. cfg.Certs is required.
func NewPool(cfg PoolConfig) (*Pool, error) {
	if cfg.Certs == nil {
		return nil, errors.New("hbone: PoolConfig.Certs is required")
	}
	if cfg.MaxStreamsPerConn <= 0 {
		cfg.MaxStreamsPerConn = 100
	}
	if cfg.SpreadStreams <= 0 {
		cfg.SpreadStreams = 4
	}
	switch {
	case cfg.SpreadConns == 0:
		cfg.SpreadConns = 4
	case cfg.SpreadConns < 0:
		cfg.SpreadConns = 1
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	p := &Pool{cfg: cfg, log: cfg.Logger, keys: make(map[poolKey]*keyConns), verified: newVerifyCache()}
	if p.log == nil {
		p.log = zap.NewNop()
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// Connect opens a tunnel for req on a pooled connection. A non-200 answer
// is a *StatusError; a connect timeout wraps ErrConnectTimeout; a rejected
// handshake wraps ErrHandshake (and ErrIdentityMismatch when the server's
// identity is not in req.Dst).
func (p *Pool) Connect(ctx context.Context, req *ConnectRequest) (*Tunnel, error) {
	pk := makePoolKey(&req.Key)
	for attempt := 0; ; attempt++ {
		c, err := p.get(ctx, pk, &req.Key)
		if err != nil {
			return nil, err
		}
		t, err := c.connect(ctx, req)
		if err != nil && errors.Is(err, errRetry) && attempt < 3 && ctx.Err() == nil {
			continue
		}
		return t, err
	}
}

// get returns a connection for pk with a stream slot reserved on it.
func (p *Pool) get(ctx context.Context, pk poolKey, key *Key) (*conn, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, fmt.Errorf("hbone: %w", ErrPoolClosed)
		}
		kc := p.keys[pk]
		if kc == nil {
			kc = &keyConns{pk: pk}
			p.keys[pk] = kc
		}
		var best *conn
		bestLoad := 0
		for _, c := range kc.conns {
			active, usable := c.load()
			if usable && active < p.cfg.MaxStreamsPerConn && (best == nil || active < bestLoad) {
				best, bestLoad = c, active
			}
		}
		spread := best != nil && bestLoad >= p.cfg.SpreadStreams && len(kc.conns) < p.cfg.SpreadConns
		if (best == nil || spread) && kc.dial == nil {
			kc.dial = &dialCall{done: make(chan struct{})}
			go p.dial(kc, kc.dial, cloneKey(key))
		}
		if best != nil {
			if best.reserve(p.cfg.MaxStreamsPerConn) {
				p.mu.Unlock()
				return best, nil
			}
			continue // it filled up or closed meanwhile; look again
		}
		dc := kc.dial
		p.mu.Unlock()
		select {
		case <-dc.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("hbone: waiting for a connection to %s: %w", key.NextHop, ctx.Err())
		}
		if dc.err != nil {
			return nil, dc.err
		}
		p.mu.Lock()
	}
}

func cloneKey(k *Key) Key {
	c := *k
	c.Dst = append([]identity.Identity(nil), k.Dst...)
	return c
}

func (p *Pool) dial(kc *keyConns, dc *dialCall, key Key) {
	c, err := dialConn(p.ctx, p.ctx, &p.cfg.ClientConfig, p.verified, key, nil, func(nc *conn) {
		nc.idleTimeout = p.cfg.IdleTimeout
		nc.onClose = func(err error) { p.remove(kc, nc, err) }
	})
	p.mu.Lock()
	kc.dial = nil
	closed := p.closed
	if err == nil && closed {
		err = fmt.Errorf("hbone: %w", ErrPoolClosed)
	}
	if err == nil {
		// A connection that died already is not added: its onClose ran (or
		// will find nothing) and it would never be removed.
		if _, usable := c.load(); usable {
			kc.conns = append(kc.conns, c)
		} else {
			// It died right after the handshake (the server rejected our
			// certificate, say): that is this dial's result.
			err = fmt.Errorf("hbone: connect %s: %w", key.NextHop, c.closedErr())
		}
	}
	if len(kc.conns) == 0 {
		p.dropKeyLocked(kc)
	}
	dc.err = err
	close(dc.done)
	p.mu.Unlock()
	if closed && c != nil {
		c.closeGracefully()
	}
	if err == nil {
		c.armIdle() // a connection nobody ends up using still expires
	}
}

func (p *Pool) remove(kc *keyConns, c *conn, err error) {
	p.mu.Lock()
	for i, x := range kc.conns {
		if x == c {
			kc.conns = append(kc.conns[:i], kc.conns[i+1:]...)
			break
		}
	}
	if len(kc.conns) == 0 && kc.dial == nil {
		p.dropKeyLocked(kc)
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Debug("hbone connection ended", zap.Stringer("peer", c.nc.RemoteAddr()), zap.Error(err))
	}
}

func (p *Pool) dropKeyLocked(kc *keyConns) {
	if p.keys[kc.pk] == kc {
		delete(p.keys, kc.pk)
	}
}

// NumConns reports the number of open connections in the pool.
func (p *Pool) NumConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, kc := range p.keys {
		n += len(kc.conns)
	}
	return n
}

// Close closes every connection and fails waiting and future Connects
// with an error wrapping ErrPoolClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	var all []*conn
	for _, kc := range p.keys {
		all = append(all, kc.conns...)
	}
	p.mu.Unlock()
	p.cancel()
	for _, c := range all {
		c.closeGracefully()
	}
	return nil
}

// Dial opens a connection for key with the pool's configuration that is
// not pooled (the caller owns and closes it), for callers that must not
// share one, such as the inner connection of double HBONE.
func (p *Pool) Dial(ctx context.Context, key Key) (*ClientConn, error) {
	c, err := dialConn(ctx, context.Background(), &p.cfg.ClientConfig, p.verified, key, nil, nil)
	if err != nil {
		return nil, err
	}
	return &ClientConn{c: c}, nil
}

// ConnectThrough opens a double HBONE tunnel, Istio's way across networks:
//
//  1. outer, a CONNECT on a pooled connection to a network gateway
//     (outer.Key: the gateway's address and identities; outer.Host and
//     Authority's port: the service hostname and port, which the gateway
//     routes by);
//  2. over that stream, a new mTLS connection (TLS 1.3, ALPN h2, the
//     source's certificate again) verifying the final destination's
//     identities inner.Key.Dst, so the gateway forwards bytes it cannot
//     read; it is not pooled: one per call, so the gateway's load
//     balancing spreads a client's connections over the remote endpoints;
//  3. on it, the inner CONNECT inner (usually the same authority, plus
//     x-forwarded-network, sent even when ForwardedNetwork is "").
//
// inner.Key.NextHop only labels errors; pass the gateway's address. The
// returned tunnel is the inner one: its byte counts are the client's
// payload, PeerIdentity the final destination's, RemoteAddr the gateway's.
// Closing it closes the inner connection and the outer stream. Errors are
// Connect's, for whichever step failed; those of the inner connection say
// "inner tunnel".
func (p *Pool) ConnectThrough(ctx context.Context, outer, inner *ConnectRequest) (*Tunnel, error) {
	ot, err := p.Connect(ctx, outer)
	if err != nil {
		return nil, err
	}
	c, err := dialConn(ctx, p.ctx, &p.cfg.ClientConfig, p.verified, inner.Key, ot, func(nc *conn) { nc.singleUse = true })
	if err != nil {
		return nil, err
	}
	if !c.reserve(maxStreamID) {
		c.closeGracefully()
		return nil, fmt.Errorf("hbone: connect %s (inner tunnel): %w", inner.Key.NextHop, c.closedErr())
	}
	in := *inner
	in.sendNetwork = true
	t, err := c.connect(ctx, &in)
	if err != nil {
		// connect gave the slot back on every error, which closed the
		// single-use connection; this is for the paths that do not.
		c.closeGracefully()
		return nil, err
	}
	return t, nil
}
