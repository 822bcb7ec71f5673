package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// Request is one inbound CONNECT as the Handler sees it.
type Request struct {
	// Peer is the client's verified identity (same trust domain as ours).
	Peer identity.Identity
	// Authority is the parsed :authority, the target the client asks for.
	// When Host is set only its port is meaningful (the Addr is zero).
	Authority netip.AddrPort
	// Host is the service hostname the :authority named instead of an IP
	// ("reviews.default.svc.cluster.local"), lower case; "" for ip:port.
	// Only a server with ServerConfig.AcceptHostnames passes such requests
	// on; the handler resolves the name.
	Host string
	// Baggage, Forwarded and Traceparent are the request headers of those
	// names, verbatim ("" when absent). See ParseBaggage, ForwardedHost and
	// TraceparentOrNew.
	Baggage, Forwarded, Traceparent string
	// ForwardedNetwork is the "x-forwarded-network" header: the client's
	// network, which the inner CONNECT of double HBONE carries (it came
	// through a network gateway). HasForwardedNetwork says whether the
	// header was present at all: Istio sends it empty for the default
	// network.
	ForwardedNetwork    string
	HasForwardedNetwork bool
	// RemoteAddr and LocalAddr are the HBONE connection's TCP addresses.
	RemoteAddr, LocalAddr net.Addr

	t *Tunnel // the stream; nil in a Request made by hand
}

// Abort ends the tunnel early, at any time and from any goroutine: before
// the answer the stream is reset and the Reply's Upstream closed; after it
// the splice ends as on a reset (Upstream closed, Done called with the
// error). A handler ends a tunnel it answered this way, not by closing
// Upstream: the splice waits for Upstream's readability without a
// goroutine, and closing the socket alone does not wake that wait at once
// (see SpliceAsync).
func (r *Request) Abort() {
	if r.t != nil {
		r.t.Close()
	}
}

// Reply is a Handler's verdict, decided before any payload flows.
type Reply struct {
	// Status to answer: 200 opens the tunnel; anything else (400, 401, 503)
	// refuses it. 0 means 200 when Upstream or Serve is set and 503 otherwise.
	Status int
	// Upstream is what a 200 tunnel is spliced with (usually the TCP
	// connection the handler dialled to the application). The server owns
	// it from here on and closes it; to end the tunnel early, call
	// Request.Abort rather than closing it. Ignored (and closed) for other
	// statuses.
	Upstream net.Conn
	// Serve, if set (with status 200 and no Upstream), takes the tunnel
	// itself instead of a splice to a connection: a handler that speaks a
	// protocol inside the tunnel (the waypoint's HTTP server) reads and
	// writes t directly, without a socket pair and two copy loops between.
	// It runs on the stream's goroutine after the 200 went out, and returns
	// when it is done with t, which the server then closes.
	Serve func(t *Tunnel) error
	// Baggage, if set, is sent as the response's baggage header.
	Baggage string
	// Done, if set, is called once when the tunnel has ended (or right after
	// a refusal was written) with the byte counts and the error that ended
	// it: nil for a clean close both ways, a *StatusError for a refusal.
	Done func(TunnelStats, error)
}

// Handler decides inbound CONNECTs. ServeHBONE runs on its own goroutine
// per stream; ctx ends when the client resets the stream, the connection
// ends or the server is closed.
type Handler interface {
	ServeHBONE(ctx context.Context, req *Request) Reply
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, req *Request) Reply

// ServeHBONE calls f.
func (f HandlerFunc) ServeHBONE(ctx context.Context, req *Request) Reply { return f(ctx, req) }

// ServerConfig configures a Server for one local workload identity (in-pod
// mode serves one pod per listener).
type ServerConfig struct {
	// Identity is the local workload: its certificate is presented and its
	// trust bundle and trust domain verify clients. Required.
	Identity identity.Identity
	// Certs supplies that certificate, per handshake. Required.
	Certs identity.CertSource
	// Handler decides each CONNECT. Required.
	Handler Handler
	// Logger gets one line per rejected connection or request; nil means none.
	Logger *zap.Logger
	// H2 tunes HTTP/2; the zero value is Istio's settings.
	H2 H2Settings
	// MaxConcurrentStreams per connection, advertised and enforced (streams
	// count until their handler and splice end); 0 means 200.
	MaxConcurrentStreams uint32
	// HandshakeTimeout bounds the TLS handshake; 0 means 10 s.
	HandshakeTimeout time.Duration
	// AcceptHostnames passes CONNECTs whose :authority is hostname:port
	// (ParseHostAuthority) to the Handler with Request.Host set; without it
	// they are refused with 400, as for any authority that is not ip:port.
	AcceptHostnames bool
	// Revocation refuses clients with a revoked certificate and closes
	// connections whose client it revokes later; nil means none.
	Revocation Revocation
}

// Server serves HBONE on the listeners given to Serve.
type Server struct {
	cfg     ServerConfig
	log     *zap.Logger
	tlsConf *tls.Config
	ctx     context.Context // cancelled by Close or an expired Shutdown
	cancel  context.CancelFunc

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	shutdown  bool
	busy      int           // connections being served plus stream goroutines
	drained   chan struct{} // closed when shutdown and busy reaches 0
}

// NewServer validates cfg and returns a Server.
func NewServer(cfg ServerConfig) (*Server, error) {
	switch {
	case cfg.Identity.IsZero():
		return nil, errors.New("hbone: ServerConfig.Identity is required")
	case cfg.Certs == nil:
		return nil, errors.New("hbone: ServerConfig.Certs is required")
	case cfg.Handler == nil:
		return nil, errors.New("hbone: ServerConfig.Handler is required")
	}
	if cfg.MaxConcurrentStreams == 0 {
		cfg.MaxConcurrentStreams = 200
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		tlsConf:   serverTLSConfig(cfg.Identity, cfg.Certs, newVerifyCache(), cfg.Revocation),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
		drained:   make(chan struct{}),
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Serve accepts connections on l until Shutdown or Close (then its error
// wraps ErrServerClosed) or an accept error that is not temporary.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		return fmt.Errorf("hbone: %w", ErrServerClosed)
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	backoff := time.Duration(0)
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			down := s.shutdown
			s.mu.Unlock()
			if down {
				return fmt.Errorf("hbone: %w", ErrServerClosed)
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporaryAcceptErr(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("hbone: accept failed; retrying", zap.Error(err), zap.Duration("backoff", backoff))
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("hbone: accept: %w", err)
		}
		backoff = 0
		if !s.track(1) {
			nc.Close()
			return fmt.Errorf("hbone: %w", ErrServerClosed)
		}
		go func() {
			defer s.track(-1)
			s.serveConn(nc)
		}()
	}
}

func isTemporaryAcceptErr(err error) bool {
	s := err.Error()
	return strings.Contains(s, "too many open files") || strings.Contains(s, "connection reset") ||
		strings.Contains(s, "connection aborted")
}

// track counts busy work for Shutdown; it refuses new connections (+1)
// after Shutdown only when nothing runs any more.
func (s *Server) track(delta int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if delta > 0 && s.shutdown && s.busy == 0 {
		return false
	}
	s.busy += delta
	if s.shutdown && s.busy == 0 {
		select {
		case <-s.drained:
		default:
			close(s.drained)
		}
	}
	return true
}

// ServeConn serves one accepted TCP connection until it ends. It is for
// callers that run their own accept loop; Serve calls it too.
func (s *Server) ServeConn(nc net.Conn) {
	if !s.track(1) {
		nc.Close()
		return
	}
	defer s.track(-1)
	s.serveConn(nc)
}

func (s *Server) serveConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAliveConfig(tcpKeepalive)
	}
	remote := nc.RemoteAddr()
	rc := newRawConn(nc)
	tc := tls.Server(rc, s.tlsConf)
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandshakeTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		s.rejectHandshake(nc, err)
		return
	}
	cs := tc.ConnectionState()
	if cs.NegotiatedProtocol != alpnH2 {
		s.log.Info("hbone: rejected connection", zap.Stringer("remote", remote),
			zap.String("reason", "client did not negotiate ALPN h2"), zap.String("alpn", cs.NegotiatedProtocol))
		tc.Close()
		return
	}
	peer := peerInTrustDomain(cs, s.cfg.Identity.TrustDomain)
	c := newConn(tc, false, s.cfg.H2, peer, s.ctx)
	c.raw = rc
	c.advMaxStreams = s.cfg.MaxConcurrentStreams
	c.maxHeaderList = 64 << 10
	c.onStream = func(t *Tunnel, fields []hpack.HeaderField) { s.onStream(c, t, fields) }
	c.onRefused = func(total int) {
		if total == 1 { // once per connection
			s.log.Info("hbone: client exceeded MAX_CONCURRENT_STREAMS; refusing streams",
				zap.Stringer("remote", remote), zap.Stringer("peer", peer),
				zap.Uint32("max_concurrent_streams", s.cfg.MaxConcurrentStreams))
		}
	}
	ended := make(chan error, 1)
	c.onClose = func(err error) { ended <- err }
	if err := c.start(); err != nil {
		<-ended
		return
	}
	s.mu.Lock()
	s.conns[c] = struct{}{}
	down := s.shutdown
	s.mu.Unlock()
	if down {
		c.goAway()
	}
	stopWatch := watchRevoked(s.cfg.Revocation, c, cs.PeerCertificates, true)
	err = <-ended
	stopWatch()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		s.log.Info("hbone: connection ended with error", zap.Stringer("remote", remote),
			zap.Stringer("peer", peer), zap.Error(err))
	}
}

// rejectHandshake logs a failed handshake once and, for a plaintext HTTP
// client, answers 400 in plaintext so the mistake is obvious.
func (s *Server) rejectHandshake(nc net.Conn, err error) {
	defer nc.Close()
	reason := "tls handshake failed"
	var rhe tls.RecordHeaderError
	if errors.As(err, &rhe) && rhe.Conn != nil {
		reason = "not TLS"
		if looksLikeHTTP(rhe.RecordHeader[:]) {
			reason = "plaintext HTTP on the HBONE port"
			nc.SetWriteDeadline(time.Now().Add(time.Second))
			io.WriteString(nc, "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"+
				"Client sent plaintext to an HBONE port: it expects HTTP/2 CONNECT over mutual TLS.\n")
		}
	}
	s.log.Info("hbone: rejected connection", zap.Stringer("remote", nc.RemoteAddr()),
		zap.String("reason", reason), zap.Error(err))
}

func looksLikeHTTP(hdr []byte) bool {
	for _, m := range [...]string{"GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "CONNE", "DELET", "PATCH", "PRI *"} {
		if string(hdr) == m {
			return true
		}
	}
	return false
}

// peerInTrustDomain returns the first SPIFFE id in the (already verified)
// client certificate that is in td.
func peerInTrustDomain(cs tls.ConnectionState, td string) identity.Identity {
	if len(cs.PeerCertificates) == 0 {
		return identity.Identity{}
	}
	for _, u := range cs.PeerCertificates[0].URIs {
		if id, err := identity.Parse(u.String()); err == nil && id.TrustDomain == td {
			return id
		}
	}
	return identity.Identity{}
}

// onStream runs on the connection's read loop for each new stream: bad
// requests are answered right here; good ones get a goroutine.
func (s *Server) onStream(c *conn, t *Tunnel, fields []hpack.HeaderField) {
	req, status, reason := parseRequest(fields, s.cfg.AcceptHostnames)
	if status != 0 {
		s.log.Info("hbone: rejected CONNECT", zap.Int("status", status), zap.String("reason", reason),
			zap.Stringer("remote", c.nc.RemoteAddr()), zap.Stringer("peer", c.peer))
		t.respond(status, "")
		c.releaseSlot()
		return
	}
	req.Peer, req.RemoteAddr, req.LocalAddr, req.t = c.peer, c.nc.RemoteAddr(), c.nc.LocalAddr(), t
	if !s.track(1) {
		t.resetWith(http2.ErrCodeRefusedStream, true)
		c.releaseSlot()
		return
	}
	go s.serveStream(c, t, req)
}

// parseRequest validates a request header list; status is 0 for a good
// CONNECT and 400 otherwise, with a reason for the log. hostnames accepts
// a hostname:port authority (ServerConfig.AcceptHostnames).
func parseRequest(fields []hpack.HeaderField, hostnames bool) (req *Request, status int, reason string) {
	req = &Request{}
	var method, authority string
	var sawAuthority, sawRegular, extended bool
	for _, f := range fields {
		if strings.HasPrefix(f.Name, ":") {
			if sawRegular {
				return nil, 400, "pseudo-header after regular header"
			}
			switch f.Name {
			case ":method":
				if method != "" {
					return nil, 400, "duplicate :method"
				}
				method = f.Value
			case ":authority":
				if sawAuthority {
					return nil, 400, "duplicate :authority"
				}
				authority, sawAuthority = f.Value, true
			case ":scheme", ":path", ":protocol":
				extended = true
			default:
				return nil, 400, fmt.Sprintf("unknown pseudo-header %q", f.Name)
			}
			continue
		}
		sawRegular = true
		if strings.ToLower(f.Name) != f.Name {
			return nil, 400, fmt.Sprintf("uppercase header name %q", f.Name)
		}
		switch f.Name {
		case "baggage":
			if req.Baggage == "" {
				req.Baggage = f.Value
			}
		case "forwarded":
			if req.Forwarded == "" {
				req.Forwarded = f.Value
			}
		case "traceparent":
			if req.Traceparent == "" {
				req.Traceparent = f.Value
			}
		case "x-forwarded-network":
			if !req.HasForwardedNetwork {
				req.ForwardedNetwork, req.HasForwardedNetwork = f.Value, true
			}
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			return nil, 400, fmt.Sprintf("connection-specific header %q", f.Name)
		}
	}
	if method != "CONNECT" {
		return nil, 400, fmt.Sprintf("method %q is not CONNECT", method)
	}
	if extended {
		return nil, 400, "CONNECT with :scheme, :path or :protocol (extended CONNECT) is not HBONE"
	}
	ap, err := ParseAuthority(authority)
	if err != nil && hostnames {
		host, port, herr := ParseHostAuthority(authority)
		if herr != nil {
			return nil, 400, herr.Error()
		}
		req.Host, req.Authority = host, netip.AddrPortFrom(netip.Addr{}, port)
		return req, 0, ""
	}
	if err != nil {
		return nil, 400, err.Error()
	}
	req.Authority = ap
	return req, 0, ""
}

func (s *Server) serveStream(c *conn, t *Tunnel, req *Request) {
	// The stream holds a slot and counts as busy until it ends: when this
	// returns, or, for a splice, in its completion.
	end := func() {
		c.releaseSlot()
		s.track(-1)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	c.mu.Lock()
	if t.err != nil {
		cancel()
	} else {
		t.cancel = cancel
	}
	c.mu.Unlock()
	rep := s.cfg.Handler.ServeHBONE(ctx, req)
	c.mu.Lock()
	t.cancel = nil
	c.mu.Unlock()
	cancel()

	status := rep.Status
	if status == 0 {
		status = 503
		if rep.Upstream != nil || rep.Serve != nil {
			status = 200
		}
	}
	if status == 200 && rep.Upstream == nil && rep.Serve == nil {
		s.log.Error("hbone: handler answered 200 without an upstream; sending 503",
			zap.Stringer("authority", req.Authority))
		status = 503
	}
	if status != 200 {
		if rep.Upstream != nil {
			rep.Upstream.Close()
		}
		t.respond(status, rep.Baggage)
		if rep.Done != nil {
			rep.Done(t.Stats(), &StatusError{Code: status})
		}
		end()
		return
	}
	if err := t.respond(200, rep.Baggage); err != nil {
		if rep.Upstream != nil {
			rep.Upstream.Close()
		}
		t.Close()
		if rep.Done != nil {
			rep.Done(t.Stats(), err)
		}
		end()
		return
	}
	if rep.Upstream != nil {
		// No goroutine while the tunnel is idle: this one returns now.
		SpliceAsync(t, rep.Upstream, func(err error) {
			if rep.Done != nil {
				rep.Done(t.Stats(), err)
			}
			end()
		})
		return
	}
	err := rep.Serve(t)
	t.Close()
	if rep.Done != nil {
		rep.Done(t.Stats(), err)
	}
	end()
}

// respond writes the response HEADERS. A non-200 answer ends the stream:
// END_STREAM, then RST_STREAM(NO_ERROR) if the client is still sending
// (RFC 9113 section 8.1).
func (t *Tunnel) respond(status int, baggage string) error {
	c := t.c
	var fa [2]hpack.HeaderField
	fields := append(fa[:0], hpack.HeaderField{Name: ":status", Value: strconv.Itoa(status)})
	if baggage != "" {
		fields = append(fields, hpack.HeaderField{Name: "baggage", Value: baggage})
	}
	end := status != 200
	c.wmu.Lock()
	c.mu.Lock()
	if err := t.writeErrLocked(); err != nil {
		c.mu.Unlock()
		c.wmu.Unlock()
		return err
	}
	t.localEnd = end
	c.mu.Unlock()
	err := c.writeHeadersLocked(t.id, end, fields...)
	c.wmu.Unlock()
	if err != nil || !end {
		return err
	}
	c.mu.Lock()
	open := !t.remoteEnd && t.err == nil
	c.mu.Unlock()
	if open {
		t.resetWith(http2.ErrCodeNo, true)
	}
	return t.Close()
}

// Shutdown stops accepting, sends GOAWAY on every connection and waits
// until their streams have finished. If ctx ends first, it closes
// everything that is left (handlers see their context cancelled) and
// returns ctx.Err().
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	ls, cs := s.stopLocked()
	if s.busy == 0 {
		select {
		case <-s.drained:
		default:
			close(s.drained)
		}
	}
	s.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, c := range cs {
		c.goAway()
	}
	select {
	case <-s.drained:
		s.cancel()
		return nil
	case <-ctx.Done():
		s.Close()
		return ctx.Err()
	}
}

// stopLocked marks the server shut down and returns its listeners and
// connections, for the caller to close once it has released s.mu.
func (s *Server) stopLocked() ([]net.Listener, []*conn) {
	s.shutdown = true
	ls := make([]net.Listener, 0, len(s.listeners))
	for l := range s.listeners {
		ls = append(ls, l)
	}
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	return ls, cs
}

// Close closes listeners and connections at once.
func (s *Server) Close() error {
	s.mu.Lock()
	ls, cs := s.stopLocked()
	s.mu.Unlock()
	s.cancel()
	for _, l := range ls {
		l.Close()
	}
	for _, c := range cs {
		c.fail(ErrServerClosed)
	}
	return nil
}
