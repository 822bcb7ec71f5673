package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel-go/proxy/route"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/drain"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/proxy/conntrace"
)

// Timeouts of the data path (docs/protocol.md#hbone).
const (
	// LocalWorkloadWait bounds the wait for the pod's own workload to
	// appear in the snapshot before a connection is refused.
	LocalWorkloadWait = 5 * time.Second
	// ConnectTimeout bounds dialling an upstream (the app, a plain TCP
	// destination, or an HBONE next hop).
	ConnectTimeout = 10 * time.Second
)

// Deps are what every pod's listener set shares. Create them once per
// process.
type Deps struct {
	// Store is the node's state. Required.
	Store *state.Store
	// Certs supplies each local workload's certificate (inbound server
	// certificate, outbound client certificate). Required.
	Certs identity.CertSource
	// Pool, when nil (in-pod mode), makes each WorkloadProxy open its own
	// HBONE pool whose dialer creates the TCP socket inside the pod's
	// network namespace with SO_MARK, as ztunnel keeps one pool per local
	// workload. When set, it is used for every pod as is and its dialer is
	// responsible for where sockets are created (dedicated mode, tests).
	Pool *hbone.Pool
	// Metrics are the istio_tcp_* metrics; nil records none.
	Metrics *Metrics
	// Log gets operational lines and, named "access", one access-log line
	// per connection; nil means none.
	Log *zap.Logger
	// Config supplies NodeName, TrustDomain, PacketMark, InpodPortReuse,
	// IPv6Enabled, EnableOrigSrc and the pool settings. Required.
	Config *config.Config
	// Resolver resolves the DNS names of endpoints known by hostname only
	// (ServiceEntry resolution DNS) when a connection is routed to one;
	// nil: such connections fail (no_healthy_upstream).
	Resolver HostResolver
	// Revocation (the node proxy's CRL manager) refuses HBONE peers, in and
	// out, whose certificate chain is revoked and closes the connections of
	// peers it revokes later; nil: no revocation checks. It is applied to
	// the pools the proxies open themselves, not to a Pool given here.
	Revocation hbone.Revocation
	// Tracer makes one span per connection and puts its context in the
	// CONNECTs the proxy opens; nil: no spans (and a random unsampled
	// traceparent per CONNECT, as Istio's ztunnel sends).
	Tracer *conntrace.Tracer
}

// HostResolver resolves a hostname from inside a pod's network namespace,
// as dnsproxy.HostResolver does (through the upstream resolvers, cached by
// TTL). The slice returned is read-only.
type HostResolver interface {
	LookupHost(ctx context.Context, ns *netns.Handle, host string) ([]netip.Addr, error)
}

// WorkloadInfo is what the node agent tells about a pod over ZDS.
type WorkloadInfo struct {
	UID, Name, Namespace, ServiceAccount string
}

// WorkloadProxy is one pod's listener set: outbound (15001), inbound
// plaintext (15006) and inbound HBONE (15008), all inside the pod's network
// namespace, with its own drain group, so removing the pod drains only its
// connections.
type WorkloadProxy struct {
	d      *Deps
	info   WorkloadInfo
	ns     *netns.Handle
	id     identity.Identity // the pod's identity, served on 15008
	log    *zap.Logger
	access *zap.Logger

	pool    *hbone.Pool
	ownPool bool
	lnOut   net.Listener
	lnPlain net.Listener
	lnHBONE net.Listener
	hsrv    *hbone.Server
	spoof   bool // dial the app from the client's IP (IP_TRANSPARENT)
	group   *drain.Group
	// acceptors counts the running 15001/15006 accept loops.
	acceptors sync.WaitGroup
	// serveMu orders Serve's acceptors.Add against Drain's Wait.
	serveMu  sync.Mutex
	inbound  registry
	local    atomic.Pointer[localCache]
	ctx      context.Context // done once the drain forces (or Close): group.Context()
	closing  atomic.Bool
	closeMu  sync.Once
	closedCh chan struct{}
}

type localCache struct {
	snap *state.Snapshot
	w    *state.Workload
}

// NewWorkloadProxy binds 15001, 15006 and 15008 inside ns (nil: the
// current namespace) with SO_MARK=Config.PacketMark, SO_REUSEPORT when
// Config.InpodPortReuse (so a new proxy can bind while an old one drains)
// and IP_TRANSPARENT where permitted (it enables keeping the client's
// source IP towards the app). On error it closes everything it opened.
func NewWorkloadProxy(d *Deps, info WorkloadInfo, ns *netns.Handle) (_ *WorkloadProxy, reterr error) {
	switch {
	case d == nil || d.Store == nil:
		return nil, errors.New("proxy: Deps.Store is required")
	case d.Certs == nil:
		return nil, errors.New("proxy: Deps.Certs is required")
	case d.Config == nil:
		return nil, errors.New("proxy: Deps.Config is required")
	case info.Name == "" || info.Namespace == "":
		return nil, errors.New("proxy: WorkloadInfo needs Name and Namespace")
	}
	sa := info.ServiceAccount
	if sa == "" {
		sa = state.DefaultServiceAccount
	}
	td := d.Config.TrustDomain
	if td == "" {
		td = identity.DefaultTrustDomain
	}
	id, err := identity.New(td, info.Namespace, sa)
	if err != nil {
		return nil, fmt.Errorf("proxy: pod %s/%s: %w", info.Namespace, info.Name, err)
	}
	log := d.Log
	if log == nil {
		log = zap.NewNop()
	}
	// p is a local, not the named result: the cleanup below and the force
	// watcher must see it even when an error return sets the result to nil.
	p := &WorkloadProxy{
		d:        d,
		info:     info,
		ns:       ns,
		id:       id,
		log:      log.With(zap.String("pod", info.Namespace+"/"+info.Name)),
		access:   log.Named("access"),
		group:    drain.New(),
		closedCh: make(chan struct{}),
	}
	// The drain's force (or Close) also ends dials and waits in progress.
	// Every connection derives from it (its connect timeout, its force
	// callback): the group's context forgets them without keeping a map
	// sized for the most connections ever open (drain.Group.Context).
	p.ctx = p.group.Context()
	var closers []func()
	defer func() {
		if reterr != nil {
			p.group.Close()
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()

	if d.Config.InpodPortReuse && ns != nil {
		p.migrateOnClose()
	}
	transparent := true
	listen := func(port uint16) (net.Listener, error) {
		ln, tp, err := p.listen(port)
		if err != nil {
			return nil, err
		}
		transparent = transparent && tp
		closers = append(closers, func() { ln.Close() })
		return ln, nil
	}
	if p.lnOut, err = listen(route.OutboundPort); err != nil {
		return nil, err
	}
	if p.lnPlain, err = listen(route.InboundPlaintextPort); err != nil {
		return nil, err
	}
	if p.lnHBONE, err = listen(route.HBONEPort); err != nil {
		return nil, err
	}
	p.spoof = d.Config.EnableOrigSrc && transparent

	p.pool = d.Pool
	if p.pool == nil {
		pool, err := hbone.NewPool(hbone.PoolConfig{
			ClientConfig: hbone.ClientConfig{
				Certs:          d.Certs,
				Dial:           p.dialHBONE,
				ConnectTimeout: ConnectTimeout,
				Revocation:     d.Revocation,
			},
			Logger:            p.log,
			MaxStreamsPerConn: d.Config.PoolMaxStreamsPerConn,
			IdleTimeout:       d.Config.PoolUnusedRelease,
		})
		if err != nil {
			return nil, fmt.Errorf("proxy: pod %s/%s: %w", info.Namespace, info.Name, err)
		}
		p.pool, p.ownPool = pool, true
		closers = append(closers, func() { pool.Close() })
	}
	p.hsrv, err = hbone.NewServer(hbone.ServerConfig{
		Identity: id,
		Certs:    d.Certs,
		Handler:  hbone.HandlerFunc(p.serveHBONE),
		Logger:   p.log,
		// Revocation refuses and closes HBONE clients the CRLs revoke.
		Revocation: d.Revocation,
		// serveHBONE resolves service hostname authorities (Istio 1.26).
		AcceptHostnames: true,
	})
	if err != nil {
		return nil, fmt.Errorf("proxy: pod %s/%s: %w", info.Namespace, info.Name, err)
	}
	return p, nil
}

// listen binds port with the pod's socket options, on [::] (dual-stack)
// when IPv6 is enabled and usable in the namespace, else on 0.0.0.0.
// IP_TRANSPARENT is best-effort: without the privilege the listener is
// bound without it and transparent is false.
func (p *WorkloadProxy) listen(port uint16) (ln net.Listener, transparent bool, err error) {
	cfg := p.d.Config
	addrs := []netip.Addr{netip.IPv4Unspecified()}
	if cfg.IPv6Enabled {
		addrs = []netip.Addr{netip.IPv6Unspecified(), netip.IPv4Unspecified()}
	}
	var errs []error
	for _, ip := range addrs {
		addr := netip.AddrPortFrom(ip, port)
		for _, tp := range []bool{true, false} {
			opts := netns.SockOpts{Mark: cfg.PacketMark, ReusePort: cfg.InpodPortReuse, Transparent: tp}
			ln, err := p.ns.Listen(context.Background(), addr, opts)
			if err == nil {
				if !tp {
					p.log.Warn("proxy: IP_TRANSPARENT not permitted; the app will see the proxy's address as source",
						zap.Uint16("port", port), zap.Errors("errors", errs))
				}
				return ln, tp, nil
			}
			errs = append(errs, err)
		}
	}
	return nil, false, fmt.Errorf("proxy: pod %s/%s: %w", p.info.Namespace, p.info.Name, errors.Join(errs...))
}

// migrateOnClose turns on net.ipv4.tcp_migrate_req in the pod's
// namespace (best-effort). With SO_REUSEPORT, a listener that closes while
// a newer proxy's listener shares its port would reset the connections
// still in its accept queue; with migration the kernel hands them to the
// other listener, so a restart loses no new connection. On a node the
// agent sets it when it captures the pod (cni/agent KernelPodSysctls):
// the node proxy's container has a read-only /proc/sys, so it only writes
// where it is not on yet (a proxy run as root, the netns tests).
func (p *WorkloadProxy) migrateOnClose() {
	const path = "/proc/sys/net/ipv4/tcp_migrate_req"
	err := p.ns.Do(func() error {
		// /proc/sys/net resolves against the calling thread's namespace.
		if cur, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(cur)) == "1" {
			return nil
		}
		return os.WriteFile(path, []byte("1"), 0)
	})
	if err != nil {
		p.log.Info("proxy: cannot enable tcp_migrate_req; a restart may reset connections queued on the old listener",
			zap.Error(err))
	}
}

// Netns identifies the pod's network namespace.
func (p *WorkloadProxy) Netns() netns.ID { return p.ns.ID() }

// Identity is the pod's identity as served on 15008.
func (p *WorkloadProxy) Identity() identity.Identity { return p.id }

// Serve accepts on the three listeners and watches policy changes until
// ctx ends (then it closes everything, as Close), Drain or Close. It
// returns nil after Drain or Close, or the first listener failure (after
// closing everything).
func (p *WorkloadProxy) Serve(ctx context.Context) error {
	errc := make(chan error, 3)
	// The accept loops are counted under serveMu, which Drain takes to set
	// closing before it waits for them: an Add racing that Wait on an
	// idle WaitGroup is a misuse (a Drain right after start, caught by
	// the race detector). Drained before it served, the proxy starts no
	// loop: Drain closed their listeners.
	p.serveMu.Lock()
	loops := !p.closing.Load()
	if loops {
		p.acceptors.Add(2)
	}
	p.serveMu.Unlock()
	if loops {
		go func() { errc <- p.acceptLoop(p.lnOut, p.serveOutbound) }()
		go func() { errc <- p.acceptLoop(p.lnPlain, p.servePlaintext) }()
	} else {
		errc <- nil
		errc <- nil
	}
	go func() {
		err := p.hsrv.Serve(p.lnHBONE)
		if errors.Is(err, hbone.ErrServerClosed) || p.closing.Load() {
			err = nil
		}
		errc <- err
	}()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		p.watchPolicies()
	}()
	stop := context.AfterFunc(ctx, p.Close)
	defer stop()
	var first error
	for range 3 {
		if err := <-errc; err != nil && first == nil {
			first = err
			p.Close()
		}
	}
	<-watchDone
	return first
}

// acceptLoop accepts until the listener is closed; each connection is
// tracked by the drain group before the next Accept (so a Drain, which
// waits for the accept loops to end first, never refuses a connection the
// kernel already handed over) and runs handle on its own goroutine with
// its done.
func (p *WorkloadProxy) acceptLoop(ln net.Listener, handle func(net.Conn, func())) error {
	defer p.acceptors.Done()
	backoff := time.Duration(0)
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.closing.Load() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				p.log.Warn("proxy: accept failed; retrying", zap.Error(err))
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("proxy: pod %s/%s: accept on %s: %w", p.info.Namespace, p.info.Name, ln.Addr(), err)
		}
		backoff = 0
		done, ok := p.group.Track()
		if !ok { // closed (Close, or the drain's force)
			c.Close()
			continue
		}
		go handle(c, done)
	}
}

// Drain stops accepting, lets open connections finish for up to deadline
// (or until ctx ends), then closes the rest, and releases everything. It
// drains only this pod.
func (p *WorkloadProxy) Drain(ctx context.Context, deadline time.Duration) {
	p.serveMu.Lock() // orders this against Serve starting the accept loops
	p.closing.Store(true)
	p.serveMu.Unlock()
	p.lnOut.Close()
	p.lnPlain.Close()
	// Every connection accepted before the close is tracked once the loops
	// are done; only then does the group refuse new ones.
	p.acceptors.Wait()
	// GOAWAY on every HBONE connection; its streams are tracked by the
	// group too and end when the group forces them.
	sctx, cancel := context.WithTimeout(ctx, deadline+time.Second)
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		_ = p.hsrv.Shutdown(sctx)
	}()
	if !p.group.Drain(ctx, deadline) {
		p.log.Info("proxy: drain deadline passed; closed the remaining connections", zap.Duration("deadline", deadline))
	}
	<-shut
	cancel()
	p.Close()
}

// Close closes the listeners and every connection at once, and the pod's
// own HBONE pool. It is idempotent.
func (p *WorkloadProxy) Close() {
	p.closeMu.Do(func() {
		p.closing.Store(true)
		p.lnOut.Close()
		p.lnPlain.Close()
		p.lnHBONE.Close()
		_ = p.hsrv.Close()
		p.group.Close() // ends p.ctx
		if p.ownPool {
			_ = p.pool.Close()
		}
		close(p.closedCh)
	})
}

// LocalWorkload is the pod's own workload in snap (nil when the snapshot
// does not have it), the one lookup the pod's listeners and its DNS proxy
// share; see localIn.
func (p *WorkloadProxy) LocalWorkload(snap *state.Snapshot) *state.Workload { return p.localIn(snap) }

// localIn finds the pod's workload in snap, caching the answer per
// snapshot. Name and namespace alone are not unique across the clusters of
// a multi-cluster mesh (nor across nodes for a recreated StatefulSet pod):
// the workload must be of this node proxy's cluster (Config.ClusterID; its
// WDS uid is "<cluster>//Pod/<ns>/<name>", looked up first) and on this
// node (Config.NodeName), and the ZDS service account must match when both
// sides name one.
func (p *WorkloadProxy) localIn(snap *state.Snapshot) *state.Workload {
	if c := p.local.Load(); c != nil && c.snap == snap {
		return c.w
	}
	found := p.findLocal(snap)
	p.local.Store(&localCache{snap: snap, w: found})
	return found
}

func (p *WorkloadProxy) findLocal(snap *state.Snapshot) *state.Workload {
	cfg := p.d.Config
	if cfg.ClusterID != "" {
		if w := snap.WorkloadByUID(cfg.ClusterID + "//Pod/" + p.info.Namespace + "/" + p.info.Name); w != nil && p.isLocal(w) {
			return w
		}
	}
	if node := cfg.NodeName; node != "" {
		for _, w := range snap.WorkloadsOnNode(node) {
			if p.isLocal(w) {
				return w
			}
		}
		return nil
	}
	for w := range snap.Workloads() {
		if p.isLocal(w) {
			return w
		}
	}
	return nil
}

// isLocal reports whether w can be this pod's workload.
func (p *WorkloadProxy) isLocal(w *state.Workload) bool {
	cfg := p.d.Config
	switch {
	case w.Name != p.info.Name || w.Namespace != p.info.Namespace || w.HostNetwork:
		return false
	case cfg.NodeName != "" && w.Node != "" && w.Node != cfg.NodeName:
		return false
	case cfg.ClusterID != "" && w.ClusterID != "" && w.ClusterID != cfg.ClusterID:
		return false
	case p.info.ServiceAccount != "" && w.ServiceAccount != "" && w.ServiceAccount != p.info.ServiceAccount:
		return false
	}
	return true
}

// errUnknownLocal: the pod's own workload did not appear in time.
var errUnknownLocal = errors.New("the pod's workload is not known to the control plane")

// waitLocal returns a snapshot holding the pod's workload, waiting up to
// LocalWorkloadWait.
func (p *WorkloadProxy) waitLocal(ctx context.Context) (*state.Snapshot, *state.Workload, error) {
	snap := p.d.Store.Load()
	if w := p.localIn(snap); w != nil {
		return snap, w, nil
	}
	wctx, cancel := context.WithTimeout(ctx, LocalWorkloadWait)
	defer cancel()
	snap, err := p.d.Store.WaitFor(wctx, func(s *state.Snapshot) bool { return p.localIn(s) != nil })
	if err != nil {
		return nil, nil, fmt.Errorf("proxy: pod %s/%s on node %q in cluster %q: %w (%w)", p.info.Namespace, p.info.Name,
			p.d.Config.NodeName, p.d.Config.ClusterID, errUnknownLocal, err)
	}
	return snap, p.localIn(snap), nil
}

// dialHBONE opens the pool's TCP connections from inside the pod.
func (p *WorkloadProxy) dialHBONE(ctx context.Context, _ netip.Addr, nextHop netip.AddrPort) (net.Conn, error) {
	return p.ns.Dial(ctx, "tcp", nextHop, netns.SockOpts{Mark: p.d.Config.PacketMark})
}

// dialApp connects to the application inside the pod, from the client's
// IP when spoofing is on and the client is not the pod itself.
func (p *WorkloadProxy) dialApp(ctx context.Context, client netip.Addr, dst netip.AddrPort) (net.Conn, error) {
	opts := netns.SockOpts{Mark: p.d.Config.PacketMark}
	if p.spoof && client.IsValid() && client != dst.Addr() && client.Is4() == dst.Addr().Is4() {
		opts.Transparent = true
		opts.LocalAddr = netip.AddrPortFrom(client, 0)
	}
	ctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	defer cancel()
	return p.ns.Dial(ctx, "tcp", dst, opts)
}

// peerOf describes a workload for metrics and logs (control-plane values
// only). The identity is left to the caller: it is only set when proven.
func peerOf(w *state.Workload) Peer {
	if w == nil {
		return Peer{}
	}
	name := w.WorkloadName
	if name == "" {
		name = w.Name
	}
	return Peer{
		Workload:          name,
		Namespace:         w.Namespace,
		CanonicalService:  w.CanonicalName,
		CanonicalRevision: w.CanonicalRevision,
		Cluster:           w.ClusterID,
		Region:            w.Locality.Region,
		Zone:              w.Locality.Zone,
		fromState:         true,
	}
}

func serviceOf(s *state.Service) Service {
	if s == nil {
		return Service{}
	}
	return Service{Hostname: s.Hostname, Namespace: s.Namespace, Name: s.Name}
}

func hasAddr(w *state.Workload, ip netip.Addr) bool {
	for _, a := range w.Addresses {
		if a == ip {
			return true
		}
	}
	return false
}
