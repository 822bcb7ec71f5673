package zds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
)

// Server-side defaults (docs/protocol.md#zds).
const (
	// DefaultLivenessInterval is how often an idle connection is probed.
	DefaultLivenessInterval = 5 * time.Second
	// DefaultAcceptInterval spaces accepts: at most 5 connections a second.
	DefaultAcceptInterval = 200 * time.Millisecond
	// livenessRead is how long a probe waits; the proxy never speaks
	// unsolicited, so a timeout means alive.
	livenessRead = 10 * time.Millisecond
)

// errConnClosed is returned for an exchange on a connection that was dropped.
var errConnClosed = errors.New("zds: proxy connection closed")

// Pod is one entry of a snapshot.
type Pod struct {
	// UID is the Kubernetes pod UID.
	UID string
	// Info names the pod for the proxy. nil is sent as an empty WorkloadInfo.
	Info *zdsapi.WorkloadInfo
	// Netns is the pod's network namespace. The Server owns it and closes it
	// once the snapshot is sent (or fails). nil means the netns is unknown:
	// the pod is announced with keep, without a descriptor.
	Netns *os.File
}

// Snapshotter supplies the pods announced to a newly connected proxy.
type Snapshotter interface {
	// Snapshot returns every pod the agent has enrolled on this node. It is
	// called without any Server lock held; the Server owns each Pod.Netns it
	// returns, so implementations hand out duplicates (DupNetns) taken under
	// their own lock, never fds they may close concurrently.
	Snapshot() []Pod
}

// DupNetns duplicates fd (close-on-exec) for a Pod.Netns.
func DupNetns(fd int) (*os.File, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("zds: dup netns fd %d: %w", fd, err)
	}
	return os.NewFile(uintptr(nfd), fmt.Sprintf("netns-dup-%d", fd)), nil
}

// ServerConfig configures Listen.
type ServerConfig struct {
	// Path of the socket, e.g. /var/run/ztunnel/ztunnel.sock. Required. A
	// stale socket file at Path is replaced; the parent directory is created.
	Path string
	// Snapshotter supplies the snapshot for each new connection. Required.
	Snapshotter Snapshotter
	// Log receives connection events; nil means no logging.
	Log *zap.Logger
	// AckTimeout bounds the wait for each ack; 0 means DefaultAckTimeout.
	AckTimeout time.Duration
	// LivenessInterval spaces probes of idle connections; 0 means
	// DefaultLivenessInterval.
	LivenessInterval time.Duration
	// AcceptInterval is the minimum time between two accepts; 0 means
	// DefaultAcceptInterval.
	AcceptInterval time.Duration
}

// Server is the agent end of ZDS. Create it with Listen, run Serve, and call
// AddWorkload / DelWorkload from any goroutine.
//
// Invariants: conns is ordered oldest first and holds only connections that
// said hello; a connection leaves it as soon as it is dropped. Each
// connection carries one exchange (request, then its ack) at a time, guarded
// by its sem; s.mu is never held while waiting for a sem.
type Server struct {
	cfg ServerConfig
	log *zap.Logger
	ln  *net.UnixListener

	mu        sync.Mutex
	conns     []*agentConn
	connected chan struct{}
	nextID    uint64
	closed    bool

	closeOnce sync.Once
	done      chan struct{} // closed by Close
	wg        sync.WaitGroup
}

// Listen creates the socket and returns a Server ready to Serve.
func Listen(cfg ServerConfig) (*Server, error) {
	if cfg.Path == "" {
		return nil, errors.New("zds: ServerConfig.Path is required")
	}
	if cfg.Snapshotter == nil {
		return nil, errors.New("zds: ServerConfig.Snapshotter is required")
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.LivenessInterval <= 0 {
		cfg.LivenessInterval = DefaultLivenessInterval
	}
	if cfg.AcceptInterval <= 0 {
		cfg.AcceptInterval = DefaultAcceptInterval
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Path), 0o755); err != nil {
		return nil, fmt.Errorf("zds: listen %s: %w", cfg.Path, err)
	}
	if fi, err := os.Lstat(cfg.Path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("zds: listen %s: exists and is not a socket", cfg.Path)
		}
		os.Remove(cfg.Path) // stale socket of an earlier agent
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: cfg.Path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("zds: listen %s: %w", cfg.Path, err)
	}
	ln.SetUnlinkOnClose(true)
	return &Server{cfg: cfg, log: cfg.Log, ln: ln, connected: make(chan struct{}), done: make(chan struct{})}, nil
}

// Addr is the socket path.
func (s *Server) Addr() string { return s.cfg.Path }

// Serve accepts proxies until ctx is done or Close is called, then drops
// every connection, removes the socket and returns nil. Other accept errors
// are returned.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	defer s.wg.Wait()
	defer s.Close()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("zds: accept on %s: %w", s.cfg.Path, err)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(ctx, c)
		}()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(s.cfg.AcceptInterval):
		}
	}
}

// Close stops accepting and drops every connection. Serve returns after its
// connection goroutines have finished.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		s.ln.Close()
		s.mu.Lock()
		conns := s.conns
		s.conns = nil
		s.closed = true
		s.mu.Unlock()
		for _, ac := range conns {
			ac.close()
		}
	})
	return nil
}

// Connected returns the number of proxies connected (hello received).
func (s *Server) Connected() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// ProxyConnected returns a channel closed the next time a proxy has received
// its whole snapshot; the agent then retries pods left pending. Take the
// channel before checking state, then wait on it.
func (s *Server) ProxyConnected() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected
}

// AddWorkload sends pod uid with its netns fd to the newest connected proxy
// and waits for the ack. The caller keeps ownership of netnsFD. It returns
// ErrNoProxy (wrapped) when no proxy is connected, a *NackError when the
// proxy refused, and other errors when the exchange failed (the connection
// is then dropped).
func (s *Server) AddWorkload(ctx context.Context, uid string, info *zdsapi.WorkloadInfo, netnsFD int) error {
	s.mu.Lock()
	var ac *agentConn
	if n := len(s.conns); n > 0 {
		ac = s.conns[n-1]
	}
	s.mu.Unlock()
	if ac == nil {
		return fmt.Errorf("zds: add %s: %w", uid, ErrNoProxy)
	}
	if err := ac.acquire(ctx); err != nil {
		return fmt.Errorf("zds: add %s: %w", uid, err)
	}
	defer ac.release()
	if err := s.exchange(ctx, ac, addRequest(uid, info), netnsFD); err != nil {
		return fmt.Errorf("zds: add %s on proxy connection %d: %w", uid, ac.id, err)
	}
	return nil
}

// DelWorkload tells every connected proxy to stop pod uid (two proxies
// overlap during an upgrade) and waits for their acks. No proxy connected is
// not an error. Failures of several connections are joined.
func (s *Server) DelWorkload(ctx context.Context, uid string) error {
	s.mu.Lock()
	conns := append([]*agentConn(nil), s.conns...)
	s.mu.Unlock()
	req := &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Del{Del: &zdsapi.DelWorkload{Uid: uid}}}
	var errs []error
	for _, ac := range conns {
		if err := ac.acquire(ctx); err != nil {
			errs = append(errs, fmt.Errorf("zds: del %s on proxy connection %d: %w", uid, ac.id, err))
			continue
		}
		err := s.exchange(ctx, ac, req, -1)
		ac.release()
		if err != nil {
			errs = append(errs, fmt.Errorf("zds: del %s on proxy connection %d: %w", uid, ac.id, err))
		}
	}
	return errors.Join(errs...)
}

func addRequest(uid string, info *zdsapi.WorkloadInfo) *zdsapi.WorkloadRequest {
	if info == nil {
		info = &zdsapi.WorkloadInfo{}
	}
	return &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{Uid: uid, WorkloadInfo: info}}}
}

// agentConn is one proxy connection.
type agentConn struct {
	id   uint64
	c    *net.UnixConn
	sem  chan struct{} // one exchange or probe at a time
	done chan struct{} // closed by close
	once sync.Once
	buf  []byte // receive buffer, used under sem
}

func (ac *agentConn) acquire(ctx context.Context) error {
	select {
	case ac.sem <- struct{}{}:
	case <-ac.done:
		return errConnClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ac.done:
		ac.release()
		return errConnClosed
	default:
		return nil
	}
}

func (ac *agentConn) tryAcquire() bool {
	select {
	case ac.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

func (ac *agentConn) release() { <-ac.sem }

func (ac *agentConn) close() {
	ac.once.Do(func() {
		close(ac.done)
		ac.c.Close()
	})
}

// drop removes ac from the connection list and closes it.
func (s *Server) drop(ac *agentConn) {
	s.mu.Lock()
	for i, c := range s.conns {
		if c == ac {
			s.conns = append(s.conns[:i:i], s.conns[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	ac.close()
}

// exchange sends req (with fd when fd >= 0) and waits for its ack; the
// caller holds ac's sem. Anything but an ACK or a NACK leaves the
// connection out of step (a late ack would answer the next request), so the
// connection is dropped.
func (s *Server) exchange(ctx context.Context, ac *agentConn, req *zdsapi.WorkloadRequest, fd int) (err error) {
	defer func() {
		var nack *NackError
		if err != nil && !errors.As(err, &nack) {
			s.log.Warn("dropping proxy connection", zap.Uint64("conn", ac.id), zap.Error(err))
			s.drop(ac)
		}
	}()
	deadline := time.Now().Add(s.cfg.AckTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	ac.c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { ac.c.SetDeadline(time.Now()) })
	defer stop()
	var fds []int
	if fd >= 0 {
		fds = []int{fd}
	}
	if err := writeMsg(ac.c, req, fds...); err != nil {
		return s.ctxErr(ctx, err)
	}
	n, got, err := readMsg(ac.c, ac.buf)
	if err != nil {
		return s.ctxErr(ctx, fmt.Errorf("zds: waiting for ack: %w", err))
	}
	if len(got) > 0 {
		closeFDs(got)
		return fmt.Errorf("%w: ack carries %d file descriptors", ErrProtocol, len(got))
	}
	return decodeAck(ac.buf[:n])
}

func (s *Server) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}

// serveConn runs one connection: hello, snapshot, then liveness probes until
// the connection or the server goes away.
func (s *Server) serveConn(ctx context.Context, c *net.UnixConn) {
	s.mu.Lock()
	s.nextID++
	ac := &agentConn{id: s.nextID, c: c, sem: make(chan struct{}, 1), done: make(chan struct{}), buf: make([]byte, MaxMessageSize)}
	s.mu.Unlock()
	log := s.log.With(zap.Uint64("conn", ac.id))
	defer s.drop(ac)
	go func() {
		select {
		case <-s.done:
			ac.close() // also unblocks the hello read
		case <-ac.done:
		}
	}()

	if err := s.readHello(ac); err != nil {
		log.Warn("proxy connection rejected", zap.Error(err))
		return
	}
	// Register with the sem held, so adds that pick this connection queue
	// behind the snapshot and reach the proxy after snapshot_sent.
	ac.sem <- struct{}{}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ac.release()
		return
	}
	s.conns = append(s.conns, ac)
	s.mu.Unlock()
	log.Info("proxy connected; sending snapshot")
	n, err := s.sendSnapshot(ctx, ac, log)
	ac.release()
	if err != nil {
		log.Warn("snapshot failed; proxy connection dropped", zap.Error(err))
		return
	}
	log.Info("snapshot sent", zap.Int("pods", n))
	s.mu.Lock()
	close(s.connected)
	s.connected = make(chan struct{})
	s.mu.Unlock()

	t := time.NewTicker(s.cfg.LivenessInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ac.done:
			return
		case <-t.C:
		}
		if !ac.tryAcquire() {
			continue // an exchange is running: it notices a dead peer itself
		}
		err := s.probe(ac)
		ac.release()
		if err != nil {
			log.Info("proxy connection closed", zap.Error(err))
			return
		}
	}
}

func (s *Server) readHello(ac *agentConn) error {
	ac.c.SetReadDeadline(time.Now().Add(s.cfg.AckTimeout))
	n, fds, err := readMsg(ac.c, ac.buf)
	if err != nil {
		return fmt.Errorf("zds: waiting for hello: %w", err)
	}
	if len(fds) > 0 {
		closeFDs(fds)
		return fmt.Errorf("%w: hello carries %d file descriptors", ErrProtocol, len(fds))
	}
	hello := &zdsapi.ZdsHello{}
	if err := proto.Unmarshal(ac.buf[:n], hello); err != nil {
		return fmt.Errorf("%w: decode hello: %w", ErrProtocol, err)
	}
	if hello.GetVersion() != zdsapi.Version_V1 {
		return fmt.Errorf("%w: hello version %v, want V1", ErrProtocol, hello.GetVersion())
	}
	return nil
}

// sendSnapshot announces every pod, then snapshot_sent. A NACK for one pod
// is logged and the snapshot goes on (the proxy keeps that pod pending);
// any other failure ends it. Every Pod.Netns is closed.
func (s *Server) sendSnapshot(ctx context.Context, ac *agentConn, log *zap.Logger) (int, error) {
	pods := s.cfg.Snapshotter.Snapshot()
	defer func() {
		for _, p := range pods {
			if p.Netns != nil {
				p.Netns.Close()
			}
		}
	}()
	for _, p := range pods {
		req, fd := addRequest(p.UID, p.Info), -1
		if p.Netns != nil {
			fd = int(p.Netns.Fd())
		} else {
			req = &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Keep{Keep: &zdsapi.KeepWorkload{Uid: p.UID}}}
		}
		err := s.exchange(ctx, ac, req, fd)
		var nack *NackError
		switch {
		case errors.As(err, &nack):
			log.Warn("proxy refused a snapshot pod", zap.String("uid", p.UID), zap.String("reason", nack.Reason))
		case err != nil:
			return 0, fmt.Errorf("zds: snapshot %s %s: %w", payloadName(req), p.UID, err)
		}
	}
	done := &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_SnapshotSent{SnapshotSent: &zdsapi.SnapshotSent{}}}
	if err := s.exchange(ctx, ac, done, -1); err != nil {
		return 0, fmt.Errorf("zds: snapshot_sent: %w", err)
	}
	return len(pods), nil
}

// probe checks an idle connection: a short read must time out. EOF, an error
// or unsolicited data (the proxy only ever answers) mean the connection is
// gone or broken.
func (s *Server) probe(ac *agentConn) error {
	ac.c.SetReadDeadline(time.Now().Add(livenessRead))
	n, fds, err := readMsg(ac.c, ac.buf)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil
	}
	if err != nil {
		return err
	}
	closeFDs(fds)
	return fmt.Errorf("%w: unsolicited %d byte message from the proxy", ErrProtocol, n)
}
