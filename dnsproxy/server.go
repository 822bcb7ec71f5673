package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// Port is the DNS proxy's port inside each captured pod (UDP and TCP).
const Port = 15053

// Defaults of Config.
const (
	DefaultMaxInflight    = 64
	DefaultMaxTCPConns    = 64
	DefaultTCPIdleTimeout = 5 * time.Second
)

// drainQuiet is how long a draining server waits for one more query before
// it considers its sockets empty (a newer server takes the new ones).
const drainQuiet = 250 * time.Millisecond

// maxQuery is the largest query accepted. A real query is one name (at most
// 255 bytes) plus a few EDNS options; anything bigger gets FORMERR.
const maxQuery = 4096

// WorkloadInfo names the pod a Server serves, as the CNI agent's ZDS message
// does.
type WorkloadInfo struct {
	// UID is the pod's Kubernetes UID as the agent sent it over ZDS (logs).
	UID             string
	Namespace, Name string
}

// Config configures one pod's Server. The zero value uses the defaults
// noted.
type Config struct {
	// Workload is the pod. Queries are attributed to the workload owning
	// their source IP; when no workload has it (a query from 127.0.0.1,
	// say), to the workload with this namespace and name. Zero means no
	// fallback: such queries get SERVFAIL.
	Workload WorkloadInfo
	// Network is the pod's network ("" = the default network): client
	// lookups by IP and the service VIPs answered are on it.
	Network string
	// ListenAddrs are the addresses to serve UDP and TCP on. nil means
	// 127.0.0.1:15053, plus [::1]:15053 when the namespace's loopback has
	// IPv6 and Resolver.DisableIPv6 is off (the capture rules REDIRECT DNS
	// from the pod's OUTPUT chain, which lands on loopback). Port 0 picks
	// one free port for both transports of that address.
	ListenAddrs []netip.AddrPort
	// Resolver decides local answers (cluster domain, IPv6, preferred
	// namespace).
	Resolver Resolver
	// MaxInflight bounds concurrently forwarded UDP queries; a query beyond
	// it gets REFUSED. 0 means DefaultMaxInflight.
	MaxInflight int
	// MaxTCPConns bounds concurrent TCP connections; one beyond it is
	// closed at once. 0 means DefaultMaxTCPConns.
	MaxTCPConns int
	// TCPIdleTimeout closes a TCP connection that sends no complete query
	// for this long. 0 means DefaultTCPIdleTimeout.
	TCPIdleTimeout time.Duration
	// ReusePort binds UDP and TCP with SO_REUSEPORT, so the next node
	// proxy's server can bind the same port while this one drains, and
	// steers the port's new UDP queries to the newest server (see
	// steerToNewest), so the older one can finish what it has and close
	// without dropping a datagram queued on its socket (Drain); TCP
	// connections queued on a closing listener move to the newer one
	// (tcp_migrate_req, which the workload proxy turns on). The
	// in-pod manager sets it with INPOD_PORT_REUSE. false: a second server
	// on the port gets "address in use".
	ReusePort bool
}

func (c Config) withDefaults() Config {
	if c.MaxInflight <= 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.MaxTCPConns <= 0 {
		c.MaxTCPConns = DefaultMaxTCPConns
	}
	if c.TCPIdleTimeout <= 0 {
		c.TCPIdleTimeout = DefaultTCPIdleTimeout
	}
	return c
}

// Deps are a Server's collaborators.
type Deps struct {
	// Store is the node state. Required.
	Store *state.Store
	// Forwarder forwards what is not answered locally. nil means nothing is
	// forwarded: those queries get SERVFAIL.
	Forwarder *Forwarder
	// Netns is the pod's network namespace, where the listeners and the
	// upstream sockets are created. nil means the current namespace.
	Netns *netns.Handle
	// Metrics are shared by every pod's server. nil means not recorded.
	Metrics *Metrics
	// Log gets one debug line per query and errors of the serve loops. nil
	// means no logging.
	Log *zap.Logger
	// Self finds the pod's own workload in a snapshot, for queries whose
	// source IP is no workload's (loopback). The in-pod manager passes the
	// pod's workload proxy's lookup (the pod the agent sent over ZDS, of
	// this node's cluster and node), so both agree on who the pod is. nil
	// means the first workload named Config.Workload (name and namespace
	// only: ambiguous across clusters; tests and single-cluster tools).
	Self func(*state.Snapshot) *state.Workload
}

// Server is one pod's DNS proxy. Create it with New, run it with Serve, stop
// it with Close (or by cancelling Serve's context).
type Server struct {
	cfg     Config
	store   *state.Store
	fwd     *Forwarder
	metrics *Metrics
	log     *zap.Logger
	up      *upstreams
	selfFn  func(*state.Snapshot) *state.Workload

	udp   []*net.UDPConn
	tcp   []net.Listener
	addrs []netip.AddrPort

	ctx    context.Context // cancelled by Close; forwards watch it
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{} // forwarded UDP queries in flight
	served atomic.Bool
	// draining: finish what is queued and in flight, then stop (Drain).
	draining atomic.Bool

	mu        sync.Mutex
	closed    bool
	tcpConns  map[net.Conn]struct{}
	closeOnce sync.Once

	self atomic.Pointer[selfCache]
}

// selfCache is the pod's own workload found in one snapshot.
type selfCache struct {
	snap *state.Snapshot
	w    *state.Workload
}

// New binds the pod's DNS listeners. On error nothing stays open.
func New(cfg Config, deps Deps) (_ *Server, reterr error) {
	if deps.Store == nil {
		return nil, errors.New("dnsproxy: Deps.Store is required")
	}
	cfg = cfg.withDefaults()
	log := deps.Log
	if log == nil {
		log = zap.NewNop()
	}
	var upOpts netns.SockOpts
	if deps.Forwarder != nil {
		upOpts = deps.Forwarder.opts
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:     cfg,
		store:   deps.Store,
		fwd:     deps.Forwarder,
		metrics: deps.Metrics,
		log: log.With(zap.String("component", "dns"), zap.String("pod", cfg.Workload.Namespace+"/"+cfg.Workload.Name),
			zap.String("uid", cfg.Workload.UID)),
		up:       newUpstreams(deps.Netns, upOpts),
		selfFn:   deps.Self,
		ctx:      ctx,
		cancel:   cancel,
		sem:      make(chan struct{}, cfg.MaxInflight),
		tcpConns: make(map[net.Conn]struct{}),
	}
	defer func() {
		if reterr != nil {
			s.closeSockets()
			cancel()
		}
	}()
	addrs := cfg.ListenAddrs
	optionalV6 := false
	if addrs == nil {
		addrs = []netip.AddrPort{netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), Port)}
		if !cfg.Resolver.DisableIPv6 {
			addrs = append(addrs, netip.AddrPortFrom(netip.IPv6Loopback(), Port))
			optionalV6 = true
		}
	}
	for _, a := range addrs {
		err := s.bind(deps.Netns, a)
		if err != nil && optionalV6 && a.Addr().Is6() && errors.Is(err, syscall.EADDRNOTAVAIL) {
			s.log.Debug("loopback has no IPv6; serving IPv4 only")
			continue
		}
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// bind opens UDP then TCP on a, with one port for both when a's port is 0.
func (s *Server) bind(h *netns.Handle, a netip.AddrPort) error {
	ctx := context.Background()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		opts := netns.SockOpts{ReusePort: s.cfg.ReusePort}
		pc, err := h.ListenPacket(ctx, a, opts)
		if err != nil {
			return fmt.Errorf("dnsproxy: %w", err)
		}
		bound := pc.LocalAddr().(*net.UDPAddr).AddrPort()
		bound = netip.AddrPortFrom(bound.Addr().Unmap(), bound.Port())
		ln, err := h.Listen(ctx, bound, opts)
		if err != nil {
			pc.Close()
			lastErr = fmt.Errorf("dnsproxy: %w", err)
			if a.Port() == 0 && errors.Is(err, syscall.EADDRINUSE) {
				continue // the UDP port is taken for TCP: pick another
			}
			return lastErr
		}
		if s.cfg.ReusePort {
			// UDP only: a closing TCP listener hands its queue to the newer
			// one (tcp_migrate_req), queued datagrams have no such move.
			// (Linux also refuses socket filters on TCP listeners.)
			if err := steerToNewest(pc); err != nil {
				// The overlap still works, spread by hash: a restart may
				// then drop queries queued on the old socket.
				s.log.Warn("dnsproxy: cannot steer the UDP port to the newest server", zap.Stringer("addr", bound), zap.Error(err))
			}
		}
		s.udp = append(s.udp, pc)
		s.tcp = append(s.tcp, ln)
		s.addrs = append(s.addrs, bound)
		return nil
	}
	return lastErr
}

// Addrs returns the bound addresses (each serves UDP and TCP).
func (s *Server) Addrs() []netip.AddrPort { return append([]netip.AddrPort(nil), s.addrs...) }

// Serve answers queries until ctx is cancelled or Close is called, then
// closes the listeners, waits for in-flight queries and returns nil. It may
// be called once.
func (s *Server) Serve(ctx context.Context) error {
	if !s.served.CompareAndSwap(false, true) {
		return errors.New("dnsproxy: Serve called twice")
	}
	// The loops are added under s.mu, which Close and Drain take before
	// they wait for them: an Add racing a Wait on an idle WaitGroup is a
	// misuse (the race detector caught a Drain right after start). A
	// server drained before it served has nothing to drain and serves
	// nothing.
	s.mu.Lock()
	closed := s.closed
	if !closed && !s.draining.Load() {
		for _, c := range s.udp {
			s.wg.Add(1)
			go s.serveUDP(c)
		}
		for _, ln := range s.tcp {
			s.wg.Add(1)
			go s.serveTCP(ln)
		}
	}
	s.mu.Unlock()
	if closed {
		return net.ErrClosed
	}
	s.log.Info("serving DNS", zap.Stringers("addrs", s.addrs))
	select {
	case <-ctx.Done():
	case <-s.ctx.Done():
	}
	s.shutdown()
	s.wg.Wait()
	return nil
}

// Drain hands the port over to a newer server and then closes, at the
// latest after deadline or when ctx ends: it closes the TCP listeners
// (connections still queued on them move to the newer listener when the
// namespace has net.ipv4.tcp_migrate_req on, as the workload proxy sets
// it), lets each open TCP connection finish the query it is on, and keeps
// answering UDP until no datagram has arrived for a moment and no forwarded
// query is in flight. With Config.ReusePort the newer server takes every
// new query, so the old sockets run empty and nothing queued is dropped.
// Without a newer server it keeps answering as long as queries keep coming,
// up to deadline.
func (s *Server) Drain(ctx context.Context, deadline time.Duration) {
	s.mu.Lock() // orders this against Serve starting its loops
	s.draining.Store(true)
	s.mu.Unlock()
	for _, ln := range s.tcp {
		ln.Close()
	}
	wake := time.Now().Add(drainQuiet)
	for _, c := range s.udp {
		c.SetReadDeadline(wake)
	}
	s.mu.Lock()
	for c := range s.tcpConns {
		c.SetReadDeadline(wake)
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.wg.Wait() // the serve loops end by themselves once drained
	}()
	t := time.NewTimer(deadline)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Info("dns drain deadline passed; closing", zap.Duration("deadline", deadline))
	case <-ctx.Done():
	}
	s.Close()
}

// Close stops the server and waits for its goroutines. It is idempotent.
func (s *Server) Close() error {
	s.shutdown()
	s.wg.Wait()
	return nil
}

func (s *Server) shutdown() {
	s.closeOnce.Do(func() {
		s.cancel()
		s.closeSockets()
		s.up.close()
	})
}

func (s *Server) closeSockets() {
	s.mu.Lock()
	s.closed = true
	conns := make([]net.Conn, 0, len(s.tcpConns))
	for c := range s.tcpConns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range s.udp {
		c.Close()
	}
	for _, ln := range s.tcp {
		ln.Close()
	}
	for _, c := range conns {
		c.Close()
	}
}

// serveUDP reads queries from c. Local answers and rejections are written
// inline; forwarded queries run on their own goroutine, at most
// MaxInflight at a time (REFUSED beyond).
func (s *Server) serveUDP(c *net.UDPConn) {
	defer s.wg.Done()
	// One byte more than the largest accepted query tells oversized
	// datagrams (silently cut to the buffer) from maximal ones.
	buf := make([]byte, maxQuery+1)
	out := make([]byte, 0, 1024)
	var q query
	for {
		if s.draining.Load() {
			c.SetReadDeadline(time.Now().Add(drainQuiet))
		}
		n, src, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if errors.Is(err, os.ErrDeadlineExceeded) && s.draining.Load() {
				if len(s.sem) == 0 {
					return // quiet, nothing in flight: drained
				}
				continue
			}
			s.log.Debug("udp read", zap.Error(err))
			continue
		}
		q.reset(protoUDP, src)
		reply, fwd := s.decide(buf[:n], &q, out)
		if reply != nil {
			c.WriteToUDPAddrPort(reply, src)
			out = reply[:0]
		}
		if !fwd {
			continue
		}
		select {
		case s.sem <- struct{}{}:
		default:
			reply := s.reject(&q, rcodeRefused, "refused: too many queries in flight", out)
			c.WriteToUDPAddrPort(reply, src)
			continue
		}
		fq := q.clone(buf[:n])
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.sem }()
			s.forward(fq, func(b []byte) { c.WriteToUDPAddrPort(b, fq.src) })
		}()
	}
}

func (s *Server) serveTCP(ln net.Listener) {
	defer s.wg.Done()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Debug("tcp accept", zap.Error(err))
			time.Sleep(10 * time.Millisecond) // EMFILE and friends: do not spin
			continue
		}
		s.mu.Lock()
		if s.closed || len(s.tcpConns) >= s.cfg.MaxTCPConns {
			s.mu.Unlock()
			conn.Close()
			continue
		}
		s.tcpConns[conn] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(conn)
	}
}

// serveConn answers length-prefixed queries on one TCP connection, one at a
// time, until the client closes it, idles or sends garbage.
func (s *Server) serveConn(conn net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.tcpConns, conn)
		s.mu.Unlock()
		conn.Close()
	}()
	src := conn.RemoteAddr().(*net.TCPAddr).AddrPort()
	var q query
	var lenBuf [2]byte
	buf := make([]byte, 512)
	out := make([]byte, 0, 1024)
	write := func(b []byte) {
		wb := make([]byte, 2+len(b))
		binary.BigEndian.PutUint16(wb, uint16(len(b)))
		copy(wb[2:], b)
		conn.SetWriteDeadline(time.Now().Add(s.cfg.TCPIdleTimeout))
		conn.Write(wb)
	}
	for {
		idle := s.cfg.TCPIdleTimeout
		if s.draining.Load() {
			idle = drainQuiet
		}
		conn.SetReadDeadline(time.Now().Add(idle))
		if _, err := io.ReadFull(conn, lenBuf[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(lenBuf[:]))
		pkt, err := readQuery(conn, n, &buf)
		if err != nil {
			return
		}
		q.reset(protoTCP, src)
		reply, fwd := s.decide(pkt, &q, out)
		if reply != nil {
			write(reply)
			out = reply[:0]
		}
		if fwd {
			s.forward(q.clone(buf[:n]), write)
		}
		if reply == nil && !fwd {
			return // dropped garbage: do not keep the connection
		}
		if s.draining.Load() {
			return // answered; the client reconnects to the newer server
		}
	}
}

// readQuery reads an n-byte TCP query into *buf (grown as needed up to
// maxQuery+1 bytes). A longer query is read to its end and discarded except
// for its first maxQuery+1 bytes, which still carry the header for a FORMERR.
func readQuery(conn net.Conn, n int, buf *[]byte) ([]byte, error) {
	keep := min(n, maxQuery+1)
	if keep > cap(*buf) {
		*buf = make([]byte, keep)
	}
	b := (*buf)[:keep]
	if _, err := io.ReadFull(conn, b); err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, conn, int64(n-keep)); err != nil {
		return nil, err
	}
	return b, nil
}

// selfWorkload returns the pod's own workload in snap: Deps.Self's answer,
// else the first found by Config.Workload, cached per snapshot.
func (s *Server) selfWorkload(snap *state.Snapshot) *state.Workload {
	if s.selfFn != nil {
		return s.selfFn(snap)
	}
	if s.cfg.Workload.Name == "" {
		return nil
	}
	if c := s.self.Load(); c != nil && c.snap == snap {
		return c.w
	}
	var found *state.Workload
	for w := range snap.Workloads() {
		if w.Name == s.cfg.Workload.Name && w.Namespace == s.cfg.Workload.Namespace && !w.HostNetwork {
			found = w
			break
		}
	}
	s.self.Store(&selfCache{snap: snap, w: found})
	return found
}

// client finds the querying workload: by source IP on the pod's network,
// else the pod itself.
func (s *Server) client(snap *state.Snapshot, src netip.Addr) *state.Workload {
	if w := snap.WorkloadByIP(s.cfg.Network, src.Unmap()); w != nil {
		return w
	}
	return s.selfWorkload(snap)
}
