package eastwest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// DefaultConnectTimeout bounds the TCP connect to the chosen destination.
const DefaultConnectTimeout = 10 * time.Second

// Snapshots is where the gateway reads the workload API state: a
// *state.Store the xDS client feeds.
type Snapshots interface {
	Load() *state.Snapshot
}

// Options configures New. Required fields say so; the others document nil.
type Options struct {
	// Identity is the gateway's own (its service account): its certificate
	// is presented to clients, and its trust domain is the one clients'
	// certificates must be in. Required.
	Identity identity.Identity
	// Certs supplies that certificate. Required.
	Certs identity.CertSource
	// State is the workload API state. Required.
	State Snapshots
	// Network is the gateway's network (the Gateway's
	// topology.istio.io/network label; "" = the default network).
	Network string
	// EndpointPort is endpoints' HBONE port; 0 means 15008. Tests set it.
	EndpointPort uint16
	// Dial opens the TCP connection to a destination's HBONE port; nil
	// means net.Dialer with TCP keepalive.
	Dial func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
	// ConnectTimeout bounds Dial; 0 means DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// Revocation refuses clients with revoked certificates; nil means none.
	Revocation hbone.Revocation
	// Log gets one line per tunnel (forwarded or refused); nil means none.
	Log *zap.Logger
	// Registerer receives the gateway's metrics; nil means they are kept
	// but not registered.
	Registerer prometheus.Registerer
	// Rand(n) returns a number in [0, n) for endpoint choice; nil means
	// math/rand/v2.IntN.
	Rand func(n int) int
}

// Gateway is a running east-west gateway. Create it with New and hand a
// listener to Serve.
type Gateway struct {
	opts  Options
	log   *zap.Logger
	srv   *hbone.Server
	conns *prometheus.CounterVec
}

// New validates opts and builds the gateway's HBONE server.
func New(opts Options) (*Gateway, error) {
	if opts.Identity.IsZero() || opts.Certs == nil || opts.State == nil {
		return nil, errors.New("eastwest: Options.Identity, Certs and State are required")
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	if opts.Dial == nil {
		opts.Dial = func(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
			d := net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 180 * time.Second, Interval: 180 * time.Second, Count: 9}}
			return d.DialContext(ctx, "tcp", addr.String())
		}
	}
	g := &Gateway{opts: opts, log: opts.Log}
	if g.log == nil {
		g.log = zap.NewNop()
	}
	g.conns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ztunnel_eastwest_connections_total",
		Help: "Outer HBONE CONNECTs the east-west gateway took, by outcome (forwarded, refused) and reason (empty when forwarded).",
	}, []string{"outcome", "reason"})
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(g.conns); err != nil {
			return nil, fmt.Errorf("eastwest: metrics: %w", err)
		}
	}
	var err error
	g.srv, err = hbone.NewServer(hbone.ServerConfig{
		Identity: opts.Identity, Certs: opts.Certs, Handler: hbone.HandlerFunc(g.ServeHBONE),
		Logger: g.log.Named("hbone"), AcceptHostnames: true, Revocation: opts.Revocation,
	})
	if err != nil {
		return nil, fmt.Errorf("eastwest: %w", err)
	}
	return g, nil
}

// Serve serves HBONE on l until Shutdown or Close.
func (g *Gateway) Serve(l net.Listener) error { return g.srv.Serve(l) }

// Shutdown stops accepting and lets open tunnels finish until ctx ends,
// then closes what is left.
func (g *Gateway) Shutdown(ctx context.Context) error { return g.srv.Shutdown(ctx) }

// Close closes the listeners and every tunnel at once.
func (g *Gateway) Close() error { return g.srv.Close() }

// errNoPeer: the client proved no identity in the trust domain (the TLS
// layer refuses such clients; this is the second lock).
var errNoPeer = errors.New("client has no mesh identity in the trust domain")

// errIPAuthority: the gateway routes by service hostname only.
var errIPAuthority = errors.New("authority is ip:port; an east-west gateway routes by service hostname:port")

// ServeHBONE decides one outer CONNECT: it accepts only hostname:port of
// a global service, dials the chosen destination's HBONE port before it
// answers 200 (so a failure is a status, not a reset), and hands the
// connection to the server to splice with the tunnel. The tunnel's bytes
// (the client's inner HBONE) are never read here.
func (g *Gateway) ServeHBONE(ctx context.Context, req *hbone.Request) hbone.Reply {
	start := time.Now()
	fields := []zap.Field{zap.String("host", req.Host), zap.Uint16("port", req.Authority.Port()),
		zap.Stringer("peer", req.Peer), zap.Stringer("remote", req.RemoteAddr)}
	refuse := func(status int, reason string, err error) hbone.Reply {
		g.conns.WithLabelValues("refused", reason).Inc()
		g.log.Info("eastwest: refused", append(fields, zap.Int("status", status), zap.String("reason", reason), zap.Error(err))...)
		return hbone.Reply{Status: status}
	}
	switch {
	case req.Peer.IsZero():
		return refuse(401, "unauthenticated", errNoPeer)
	case req.Host == "":
		return refuse(400, "ip_authority", fmt.Errorf("%s: %w", req.Authority, errIPAuthority))
	}
	snap := g.opts.State.Load()
	d, err := Route(snap, Scope{Network: g.opts.Network, EndpointPort: g.opts.EndpointPort}, req.Host, req.Authority.Port(), g.opts.Rand)
	if err != nil {
		return refuse(Status(err), Reason(err), err)
	}
	fields = append(fields, zap.String("service", d.Service.Key), zap.Stringer("dst", d.Addr), zap.Bool("waypoint", d.Waypoint))
	if d.Workload != nil {
		fields = append(fields, zap.String("dst_workload", d.Workload.Namespace+"/"+d.Workload.Name))
	}
	dctx, cancel := context.WithTimeout(ctx, g.opts.ConnectTimeout)
	up, err := g.opts.Dial(dctx, d.Addr)
	cancel()
	if err != nil {
		return refuse(503, "connect_failed", fmt.Errorf("dial %s: %w", d.Addr, err))
	}
	g.conns.WithLabelValues("forwarded", "").Inc()
	return hbone.Reply{Status: 200, Upstream: up, Done: func(st hbone.TunnelStats, err error) {
		f := append(fields, zap.Int64("bytes_sent", st.BytesSent), zap.Int64("bytes_recv", st.BytesReceived),
			zap.Duration("duration", time.Since(start)))
		if err != nil {
			f = append(f, zap.Error(err))
		}
		g.log.Info("eastwest: forwarded", f...)
	}}
}
