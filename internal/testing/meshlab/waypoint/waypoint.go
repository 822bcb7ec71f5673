// Package waypoint is a small test waypoint for meshlab: inside a waypoint
// pod's network namespace it terminates HBONE on 15008 with its own workload
// identity (certificate from the mesh CA, requested with its node's token
// like a node proxy would), routes each CONNECT's authority with the same
// decision the node proxy uses (route.Outbound from the waypoint's own xDS
// state, so a service bound to this waypoint is sent to an endpoint, not
// back here), and re-originates HBONE (or plain TCP to a workload outside
// the mesh). It records every authority and peer it saw.
//
// It is not an Envoy waypoint: no L7, no policy of its own, no telemetry
// beyond the record.
package waypoint

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/ztunnel-go/ztunnel-go/proxy/route"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// Config describes the waypoint. Every field is required except Log.
type Config struct {
	// Netns is the waypoint pod's network namespace (the caller keeps it
	// open); IP is the pod's address.
	Netns *netns.Handle
	IP    netip.Addr
	// Identity is the waypoint's workload identity (ns/sa of its pod).
	Identity identity.Identity
	// ControlPlane is the xDS + CA address; RootCAs verify it; Token is the
	// bearer token of Node, the node the waypoint pod runs on.
	ControlPlane netip.AddrPort
	RootCAs      *x509.CertPool
	Token        string
	Node         string
	// Log; nil means none.
	Log *zap.Logger
}

// Seen is one CONNECT the waypoint received.
type Seen struct {
	Peer      identity.Identity // the client's verified identity
	Authority netip.AddrPort    // the original destination it asked for
	// Upstream is where the waypoint sent it ("hbone 10.31.1.12:15008
	// authority 10.31.1.12:8080"), or the routing error.
	Upstream string
}

// Waypoint is a running test waypoint.
type Waypoint struct {
	cfg    Config
	store  *state.Store
	certs  *certmanager.Manager
	req    *certmanager.GRPCRequester
	pool   *hbone.Pool
	srv    *hbone.Server
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	seen []Seen
}

// Start connects to the control plane, waits for the first xDS sync and the
// waypoint's certificate (bounded by ctx), and serves 15008.
func Start(ctx context.Context, cfg Config) (w *Waypoint, err error) {
	if cfg.Netns == nil || !cfg.IP.IsValid() || cfg.Identity.IsZero() || !cfg.ControlPlane.IsValid() ||
		cfg.RootCAs == nil || cfg.Token == "" || cfg.Node == "" {
		return nil, errors.New("waypoint: Netns, IP, Identity, ControlPlane, RootCAs, Token and Node are required")
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	h := cfg.Netns
	// gRPC to the control plane from inside the pod, as its node's proxy.
	dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, err
		}
		return h.Dial(ctx, "tcp", ap, netns.SockOpts{})
	})
	runCtx, cancel := context.WithCancel(context.Background())
	w = &Waypoint{cfg: cfg, store: state.NewStore(), cancel: cancel}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	xc, err := xds.NewClient(xds.ClientConfig{
		Address: cfg.ControlPlane.String(), RootCAs: cfg.RootCAs, Token: cfg.Token,
		Node: xds.NodeInfo{
			PodName: "waypoint-" + cfg.Identity.ServiceAccount, PodNamespace: cfg.Identity.Namespace,
			NodeName: cfg.Node, InstanceIPs: []string{cfg.IP.String()},
		},
		Sink: w.store, Log: cfg.Log.Named("xds"), DialOptions: []grpc.DialOption{dialer},
	})
	if err != nil {
		return nil, fmt.Errorf("waypoint: %w", err)
	}
	w.done = make(chan struct{})
	go func() {
		defer close(w.done)
		_ = xc.Run(runCtx)
	}()
	if w.req, err = certmanager.NewGRPCRequester(certmanager.GRPCConfig{
		Address: cfg.ControlPlane.String(), RootCAs: cfg.RootCAs, Token: certmanager.StaticToken(cfg.Token),
		DialOptions: []grpc.DialOption{dialer},
	}); err != nil {
		return nil, fmt.Errorf("waypoint: %w", err)
	}
	if w.certs, err = certmanager.New(certmanager.Config{}, certmanager.Deps{Requester: w.req, Logger: cfg.Log.Named("certs")}); err != nil {
		return nil, fmt.Errorf("waypoint: %w", err)
	}
	select {
	case <-xc.Synced():
	case <-ctx.Done():
		return nil, fmt.Errorf("waypoint: waiting for the first xDS sync: %w", ctx.Err())
	}
	if _, err := w.certs.Fetch(ctx, cfg.Identity); err != nil {
		return nil, fmt.Errorf("waypoint: certificate for %s: %w", cfg.Identity, err)
	}
	if w.pool, err = hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{
		Certs: w.certs,
		Dial: func(ctx context.Context, _ netip.Addr, hop netip.AddrPort) (net.Conn, error) {
			return h.Dial(ctx, "tcp", hop, netns.SockOpts{})
		},
	}}); err != nil {
		return nil, fmt.Errorf("waypoint: %w", err)
	}
	if w.srv, err = hbone.NewServer(hbone.ServerConfig{
		Identity: cfg.Identity, Certs: w.certs, Handler: hbone.HandlerFunc(w.serve), Logger: cfg.Log.Named("hbone"),
	}); err != nil {
		return nil, fmt.Errorf("waypoint: %w", err)
	}
	ln, err := h.Listen(ctx, netip.AddrPortFrom(netip.IPv4Unspecified(), route.HBONEPort), netns.SockOpts{})
	if err != nil {
		return nil, fmt.Errorf("waypoint: listen: %w", err)
	}
	go func() { _ = w.srv.Serve(ln) }()
	return w, nil
}

// serve routes one CONNECT from the waypoint's point of view and opens the
// upstream before answering (the server writes 200 only with an upstream).
func (w *Waypoint) serve(ctx context.Context, req *hbone.Request) hbone.Reply {
	s := Seen{Peer: req.Peer, Authority: req.Authority}
	defer func() {
		w.mu.Lock()
		w.seen = append(w.seen, s)
		w.mu.Unlock()
	}()
	snap := w.store.Load()
	self := snap.WorkloadByIP("", w.cfg.IP)
	d, err := route.Outbound(snap, self, req.Authority)
	if err != nil {
		s.Upstream = "route: " + err.Error()
		return hbone.Reply{Status: 503}
	}
	var up net.Conn
	switch d.Kind {
	case route.HBONE:
		s.Upstream = fmt.Sprintf("hbone %s authority %s", d.NextHop, d.Authority)
		up, err = w.pool.Connect(ctx, &hbone.ConnectRequest{
			Key:       hbone.Key{Src: w.cfg.Identity, Dst: d.UpstreamIdentities(), SrcIP: w.cfg.IP, NextHop: d.NextHop},
			Authority: d.Authority,
		})
	default:
		s.Upstream = fmt.Sprintf("%s %s", d.Kind, d.NextHop)
		up, err = w.cfg.Netns.Dial(ctx, "tcp", d.NextHop, netns.SockOpts{})
	}
	if err != nil {
		s.Upstream += ": " + err.Error()
		return hbone.Reply{Status: 503}
	}
	return hbone.Reply{Status: 200, Upstream: up}
}

// Seen returns the CONNECTs so far, oldest first.
func (w *Waypoint) Seen() []Seen {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Seen(nil), w.seen...)
}

// Close stops serving and disconnects from the control plane.
func (w *Waypoint) Close() error {
	var errs []error
	if w.srv != nil {
		errs = append(errs, w.srv.Close())
	}
	if w.pool != nil {
		errs = append(errs, w.pool.Close())
	}
	if w.certs != nil {
		errs = append(errs, w.certs.Close())
	}
	if w.req != nil {
		errs = append(errs, w.req.Close())
	}
	w.cancel()
	if w.done != nil {
		<-w.done
	}
	return errors.Join(errs...)
}
