package dnsproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// Defaults of ForwarderConfig.
const (
	// DefaultResolvConf is the node proxy's own resolver configuration.
	DefaultResolvConf = "/etc/resolv.conf"
	// DefaultTimeout bounds one forwarded query (ztunnel's 5 s).
	DefaultTimeout = 5 * time.Second
	// DefaultMark is ztunnel's SO_MARK (0x539): the in-pod rules never
	// redirect packets that carry it.
	DefaultMark = 1337
)

// maxMsg is the largest DNS message (TCP length prefix, UDP datagram).
const maxMsg = dns.MaxMsgSize

// idleUpstreamConns bounds the idle UDP sockets a pod keeps per upstream.
const idleUpstreamConns = 8

// ErrNoUpstream is returned by NewForwarder when there is no nameserver to
// forward to.
var ErrNoUpstream = errors.New("dnsproxy: no upstream nameserver")

// ErrUpstream is wrapped by forwarding failures: no upstream answered in
// time.
var ErrUpstream = errors.New("dnsproxy: no upstream answer")

// ForwarderConfig configures NewForwarder. The zero value reads
// /etc/resolv.conf and uses the defaults noted.
type ForwarderConfig struct {
	// ResolvConf is the node proxy's resolv.conf; "" means
	// DefaultResolvConf. Only its nameserver lines are used: queries are
	// forwarded verbatim, so the search list and ndots do not apply.
	ResolvConf string
	// Servers, when not empty, are the upstreams instead of ResolvConf's
	// nameservers (which is then not read).
	Servers []netip.AddrPort
	// Timeout bounds one forwarded query over every upstream and both
	// transports; 0 means DefaultTimeout. Each upstream in turn gets an
	// equal share of it.
	Timeout time.Duration
	// Mark is the SO_MARK of upstream sockets; 0 means DefaultMark.
	Mark uint32
	// NoMark leaves upstream sockets unmarked (unprivileged tests only: in a
	// captured pod the forwarded queries would be captured again).
	NoMark bool
}

// Forwarder holds the upstream resolvers and forwarding settings shared by
// every pod's Server. Build it once per process; it is immutable and safe
// for concurrent use. Sockets are per pod (see upstreams), not here.
type Forwarder struct {
	servers []netip.AddrPort
	timeout time.Duration
	opts    netns.SockOpts
	bufs    sync.Pool // *[]byte of maxMsg bytes, one per in-flight forward
}

// NewForwarder reads the upstream configuration.
func NewForwarder(cfg ForwarderConfig) (*Forwarder, error) {
	f := &Forwarder{servers: cfg.Servers, timeout: cfg.Timeout}
	if f.timeout <= 0 {
		f.timeout = DefaultTimeout
	}
	switch {
	case cfg.NoMark:
	case cfg.Mark == 0:
		f.opts.Mark = DefaultMark
	default:
		f.opts.Mark = cfg.Mark
	}
	if len(f.servers) == 0 {
		path := cfg.ResolvConf
		if path == "" {
			path = DefaultResolvConf
		}
		servers, err := readResolvConf(path)
		if err != nil {
			return nil, err
		}
		f.servers = servers
	}
	if len(f.servers) == 0 {
		return nil, ErrNoUpstream
	}
	f.servers = append([]netip.AddrPort(nil), f.servers...)
	f.bufs.New = func() any { b := make([]byte, maxMsg); return &b }
	return f, nil
}

func readResolvConf(path string) ([]netip.AddrPort, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("dnsproxy: read %s: %w", path, err)
	}
	port, err := strconv.ParseUint(cc.Port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("dnsproxy: %s: port %q: %w", path, cc.Port, err)
	}
	var out []netip.AddrPort
	for _, s := range cc.Servers {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("dnsproxy: %s: nameserver %q is not an IP address", path, s)
		}
		out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(port)))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoUpstream, path)
	}
	return out, nil
}

// Servers returns the upstream nameservers, in the order they are tried.
func (f *Forwarder) Servers() []netip.AddrPort { return append([]netip.AddrPort(nil), f.servers...) }

func (f *Forwarder) getBuf() *[]byte  { return f.bufs.Get().(*[]byte) }
func (f *Forwarder) putBuf(b *[]byte) { f.bufs.Put(b) }

// exchange forwards query (a packed message that passed validation: one
// question, uncompressed at offset 12) through up and reads the answer into
// buf (maxMsg bytes), returning its length. The upstream sees a fresh random
// ID; the answer carries the query's ID again. Upstreams are tried in order,
// each over UDP first and then TCP when the UDP answer is truncated.
func (f *Forwarder) exchange(ctx context.Context, up *upstreams, query, buf []byte) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	id := binary.BigEndian.Uint16(query)
	out := make([]byte, len(query))
	copy(out, query)
	var errs []error
	for i, server := range f.servers {
		deadline, _ := ctx.Deadline()
		if left := len(f.servers) - i; left > 1 {
			deadline = time.Now().Add(time.Until(deadline) / time.Duration(left))
		}
		n, err := f.tryServer(ctx, up, server, deadline, out, buf)
		if err == nil {
			binary.BigEndian.PutUint16(buf, id)
			return n, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return 0, fmt.Errorf("%w: %w", ErrUpstream, errors.Join(errs...))
}

// tryServer asks one upstream: UDP, then TCP if the UDP answer has TC set.
func (f *Forwarder) tryServer(ctx context.Context, up *upstreams, server netip.AddrPort, deadline time.Time, out, buf []byte) (int, error) {
	binary.BigEndian.PutUint16(out, uint16(rand.Uint32()))
	n, err := up.exchangeUDP(ctx, server, deadline, out, buf)
	if err != nil {
		return 0, err
	}
	if buf[2]&0x02 == 0 { // TC
		return n, nil
	}
	truncated := append([]byte(nil), buf[:n]...)
	binary.BigEndian.PutUint16(out, uint16(rand.Uint32()))
	m, err := up.exchangeTCP(ctx, server, deadline, out, buf)
	if err == nil {
		return m, nil
	}
	if ctx.Err() != nil {
		return 0, err
	}
	// TCP failed: the truncated UDP answer is still an answer (the client
	// may retry over TCP itself).
	return copy(buf, truncated), nil
}

// upstreams are one pod's sockets to the upstream resolvers: created in the
// pod's network namespace with the forwarder's mark, UDP sockets connected
// to one upstream each and reused (at most idleUpstreamConns idle per
// upstream); TCP connections are made per query (only after truncation).
type upstreams struct {
	h    *netns.Handle
	opts netns.SockOpts

	mu     sync.Mutex
	closed bool
	idle   map[netip.AddrPort][]*net.UDPConn
}

func newUpstreams(h *netns.Handle, opts netns.SockOpts) *upstreams {
	return &upstreams{h: h, opts: opts, idle: make(map[netip.AddrPort][]*net.UDPConn)}
}

func (u *upstreams) get(ctx context.Context, server netip.AddrPort) (*net.UDPConn, error) {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil, net.ErrClosed
	}
	if l := u.idle[server]; len(l) > 0 {
		c := l[len(l)-1]
		u.idle[server] = l[:len(l)-1]
		u.mu.Unlock()
		return c, nil
	}
	u.mu.Unlock()
	c, err := u.h.Dial(ctx, "udp", server, u.opts)
	if err != nil {
		return nil, err
	}
	return c.(*net.UDPConn), nil
}

func (u *upstreams) put(server netip.AddrPort, c *net.UDPConn) {
	u.mu.Lock()
	if !u.closed && len(u.idle[server]) < idleUpstreamConns {
		u.idle[server] = append(u.idle[server], c)
		c = nil
	}
	u.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// close closes the idle sockets; sockets in use are closed when returned.
func (u *upstreams) close() {
	u.mu.Lock()
	u.closed = true
	var toClose []*net.UDPConn
	for _, l := range u.idle {
		toClose = append(toClose, l...)
	}
	u.idle = nil
	u.mu.Unlock()
	for _, c := range toClose {
		c.Close()
	}
}

// exchangeUDP sends out and waits for the answer that matches its ID and
// question, ignoring strays (late answers to earlier queries on a reused
// socket, or spoofing attempts).
func (u *upstreams) exchangeUDP(ctx context.Context, server netip.AddrPort, deadline time.Time, out, buf []byte) (int, error) {
	c, err := u.get(ctx, server)
	if err != nil {
		return 0, fmt.Errorf("udp %s: %w", server, err)
	}
	stop := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()) })
	// release returns the socket to the pool when it is still good and the
	// AfterFunc can no longer touch it.
	release := func(reuse bool) {
		if stop() && reuse {
			u.put(server, c)
		} else {
			c.Close()
		}
	}
	if err := c.SetDeadline(deadline); err != nil {
		release(false)
		return 0, fmt.Errorf("udp %s: %w", server, err)
	}
	if _, err := c.Write(out); err != nil {
		release(false)
		return 0, fmt.Errorf("udp %s: %w", server, err)
	}
	for {
		n, err := c.Read(buf)
		if err != nil {
			// After our own deadline the socket is fine for reuse: a late
			// answer will be skipped by its ID.
			var ne net.Error
			release(errors.As(err, &ne) && ne.Timeout())
			return 0, fmt.Errorf("udp %s: %w", server, err)
		}
		if answers(out, buf[:n]) {
			release(true)
			return n, nil
		}
	}
}

// exchangeTCP asks server over a new TCP connection.
func (u *upstreams) exchangeTCP(ctx context.Context, server netip.AddrPort, deadline time.Time, out, buf []byte) (int, error) {
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	c, err := u.h.Dial(dctx, "tcp", server, u.opts)
	if err != nil {
		return 0, fmt.Errorf("tcp %s: %w", server, err)
	}
	defer c.Close()
	stop := context.AfterFunc(dctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if err := c.SetDeadline(deadline); err != nil {
		return 0, fmt.Errorf("tcp %s: %w", server, err)
	}
	msg := make([]byte, 2+len(out))
	binary.BigEndian.PutUint16(msg, uint16(len(out)))
	copy(msg[2:], out)
	if _, err := c.Write(msg); err != nil {
		return 0, fmt.Errorf("tcp %s: %w", server, err)
	}
	if _, err := io.ReadFull(c, buf[:2]); err != nil {
		return 0, fmt.Errorf("tcp %s: %w", server, err)
	}
	n := int(binary.BigEndian.Uint16(buf))
	if _, err := io.ReadFull(c, buf[:n]); err != nil {
		return 0, fmt.Errorf("tcp %s: %w", server, err)
	}
	if !answers(out, buf[:n]) {
		return 0, fmt.Errorf("tcp %s: answer does not match the query", server)
	}
	return n, nil
}

// answers reports whether resp is a response to query: same ID, QR set,
// and the same question (names compared case-insensitively). A response
// without a question is accepted only with an error rcode (some servers
// send bare REFUSED or FORMERR headers).
func answers(query, resp []byte) bool {
	if len(resp) < 12 || resp[0] != query[0] || resp[1] != query[1] || resp[2]&0x80 == 0 {
		return false
	}
	qd := binary.BigEndian.Uint16(resp[4:])
	if qd == 0 {
		return resp[3]&0x0f != dns.RcodeSuccess
	}
	qe, re := questionEnd(query), questionEnd(resp)
	return qd == 1 && qe > 0 && qe == re && bytes.EqualFold(query[12:qe], resp[12:re])
}

// questionEnd returns the offset after the first question, or -1 when the
// question is malformed or its name compressed.
func questionEnd(msg []byte) int {
	off := 12
	for {
		if off >= len(msg) {
			return -1
		}
		l := int(msg[off])
		if l == 0 {
			off++
			break
		}
		if l&0xc0 != 0 {
			return -1
		}
		off += 1 + l
	}
	if off+4 > len(msg) {
		return -1
	}
	return off + 4
}
