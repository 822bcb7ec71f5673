package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SockOpts are the socket options the proxy needs, applied before bind/connect
// through the Control hook. The zero value sets nothing.
//
// TCP_NODELAY is not an option here: Go already enables it on every TCP
// connection it creates or accepts (the tests assert that).
type SockOpts struct {
	// Mark sets SO_MARK when non-zero. ztunnel marks every socket with 1337
	// (0x539) so the in-pod rules never redirect its own traffic.
	Mark uint32
	// ReusePort sets SO_REUSEPORT.
	ReusePort bool
	// Transparent sets IP_TRANSPARENT and IP_FREEBIND (IPV6_TRANSPARENT and
	// IPV6_FREEBIND on IPv6 sockets), so a socket can bind a non-local
	// address, e.g. the original client IP on inbound connections to the app.
	Transparent bool
	// LocalAddr, if valid, is the address Dial binds before connecting
	// (port 0 = any). Ignored by Listen and ListenPacket.
	LocalAddr netip.AddrPort
	// keepAlive sets SO_KEEPALIVE and Go's listener keep-alive values
	// (Listen sets it on its listening socket).
	keepAlive bool
}

// Control sets the options on the raw socket. It fits
// net.ListenConfig.Control and net.Dialer.Control.
func (o SockOpts) Control(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = o.set(int(fd), strings.HasSuffix(network, "6"))
	})
	if err != nil {
		return err
	}
	return serr
}

func (o SockOpts) set(fd int, v6 bool) error {
	type opt struct {
		level, name, value int
		label              string
	}
	var opts []opt
	if o.Mark != 0 {
		opts = append(opts, opt{unix.SOL_SOCKET, unix.SO_MARK, int(o.Mark), "SO_MARK"})
	}
	if o.ReusePort {
		opts = append(opts, opt{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1, "SO_REUSEPORT"})
	}
	if o.keepAlive {
		opts = append(opts,
			opt{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
			opt{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, keepAliveIdle, "TCP_KEEPIDLE"},
			opt{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, keepAliveInterval, "TCP_KEEPINTVL"},
			opt{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepAliveCount, "TCP_KEEPCNT"})
	}
	switch {
	case o.Transparent && v6:
		opts = append(opts,
			opt{unix.IPPROTO_IPV6, unix.IPV6_TRANSPARENT, 1, "IPV6_TRANSPARENT"},
			opt{unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1, "IPV6_FREEBIND"})
	case o.Transparent:
		opts = append(opts,
			opt{unix.IPPROTO_IP, unix.IP_TRANSPARENT, 1, "IP_TRANSPARENT"},
			opt{unix.IPPROTO_IP, unix.IP_FREEBIND, 1, "IP_FREEBIND"})
	}
	for _, op := range opts {
		if err := unix.SetsockoptInt(fd, op.level, op.name, op.value); err != nil {
			return fmt.Errorf("netns: setsockopt %s: %w", op.label, err)
		}
	}
	return nil
}

// The keep-alive every accepted connection gets: Go's defaults for a
// listener (15 s idle, 15 s between probes, 9 probes).
const (
	keepAliveIdle     = 15
	keepAliveInterval = 15
	keepAliveCount    = 9
)

// Listen opens a TCP listener on addr inside h's namespace.
//
// Keep-alive is set once, on the listening socket, and accepted
// connections inherit it from there (Linux copies SO_KEEPALIVE and the
// TCP_KEEP* values to each child socket): Go would otherwise make the same
// four setsockopt calls on every connection it accepts, on the path of its
// first byte (TestListenKeepAliveInherited).
func (h *Handle) Listen(ctx context.Context, addr netip.AddrPort, o SockOpts) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() error {
		var err error
		o.keepAlive = true
		lc := net.ListenConfig{KeepAlive: -1, Control: o.Control}
		ln, err = lc.Listen(ctx, "tcp", addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns: listen tcp %s in %s: %w", addr, h, err)
	}
	return ln, nil
}

// ListenPacket opens a UDP socket on addr inside h's namespace.
func (h *Handle) ListenPacket(ctx context.Context, addr netip.AddrPort, o SockOpts) (*net.UDPConn, error) {
	var pc net.PacketConn
	err := h.Do(func() error {
		var err error
		lc := net.ListenConfig{Control: o.Control}
		pc, err = lc.ListenPacket(ctx, "udp", addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns: listen udp %s in %s: %w", addr, h, err)
	}
	return pc.(*net.UDPConn), nil
}

// Dial connects to addr from inside h's namespace. network is "tcp" or "udp".
// Addresses are IP literals on purpose: no name resolution happens in the
// target namespace.
//
// Only the socket is created inside the namespace (a socket keeps the
// namespace it was made in); binding and connecting happen on the caller's
// goroutine. A connect that waited on a thread locked into the namespace
// cost several thread hand-offs per dial (BenchmarkDial: futex calls per
// dial fell from 6 to 2), and held a locked OS thread for a whole
// round trip. The socket itself usually comes from a pool made ahead in
// the namespace (pool.go), so a dial does not enter it at all.
func (h *Handle) Dial(ctx context.Context, network string, addr netip.AddrPort, o SockOpts) (net.Conn, error) {
	if network != "tcp" && network != "udp" {
		return nil, fmt.Errorf("netns: dial: unsupported network %q", network)
	}
	var c net.Conn
	var err error
	if h == nil {
		c, err = dialHere(ctx, network, addr, o)
	} else {
		c, err = h.dialFromSocket(ctx, network, addr, o)
	}
	if err != nil {
		return nil, fmt.Errorf("netns: dial %s %s in %s: %w", network, addr, h, err)
	}
	return c, nil
}

func dialHere(ctx context.Context, network string, addr netip.AddrPort, o SockOpts) (net.Conn, error) {
	d := net.Dialer{Control: o.Control}
	switch {
	case !o.LocalAddr.IsValid():
	case network == "tcp":
		d.LocalAddr = net.TCPAddrFromAddrPort(o.LocalAddr)
	default:
		d.LocalAddr = net.UDPAddrFromAddrPort(o.LocalAddr)
	}
	return d.DialContext(ctx, network, addr.String())
}

// dialFromSocket makes the socket in h, then binds, connects and waits for
// the connection outside it. The socket is non-blocking from birth, so the
// wait goes through the runtime poller like any Go dial.
func (h *Handle) dialFromSocket(ctx context.Context, network string, addr netip.AddrPort, o SockOpts) (net.Conn, error) {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	v6 := addr.Addr().Is6()
	family, sotype := unix.AF_INET, unix.SOCK_STREAM
	if v6 {
		family = unix.AF_INET6
	}
	if network == "udp" {
		sotype = unix.SOCK_DGRAM
	}
	fd, err := h.socket(family, sotype)
	if err != nil {
		return nil, err
	}
	// From here on f owns fd; net.FileConn dups it, so f is closed in
	// every case.
	f := os.NewFile(uintptr(fd), "netns-dial")
	defer f.Close()
	if err := o.set(fd, v6); err != nil {
		return nil, err
	}
	if o.LocalAddr.IsValid() {
		if err := unix.Bind(fd, sockaddr(netip.AddrPortFrom(o.LocalAddr.Addr().Unmap(), o.LocalAddr.Port()), v6)); err != nil {
			return nil, fmt.Errorf("bind %s: %w", o.LocalAddr, err)
		}
	}
	if err := connect(ctx, f, fd, sockaddr(addr, v6)); err != nil {
		return nil, err
	}
	return net.FileConn(f)
}

// connect starts a non-blocking connect and waits until it completes, fails
// or ctx ends.
func connect(ctx context.Context, f *os.File, fd int, sa unix.Sockaddr) error {
	switch err := unix.Connect(fd, sa); err {
	case nil, unix.EISCONN:
		return nil
	case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
	default:
		return fmt.Errorf("connect: %w", err)
	}
	if d, ok := ctx.Deadline(); ok {
		if err := f.SetWriteDeadline(d); err != nil {
			return err
		}
	}
	stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	werr := rc.Write(func(fd uintptr) bool {
		n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		switch {
		case err != nil:
			cerr = fmt.Errorf("getsockopt SO_ERROR: %w", err)
			return true
		case n != 0 && unix.Errno(n) != unix.EINPROGRESS && unix.Errno(n) != unix.EALREADY && unix.Errno(n) != unix.EINTR:
			cerr = fmt.Errorf("connect: %w", unix.Errno(n))
			return true
		}
		// No error yet is also what a connect still under way reports;
		// only a peer address proves it is done.
		if _, err := unix.Getpeername(int(fd)); err == nil {
			return true
		}
		return false
	})
	if werr != nil {
		// The write deadline stands in for ctx; report ctx's own error, as
		// net.Dialer does, even when the deadline fired a moment before
		// ctx's timer.
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		if _, ok := ctx.Deadline(); ok && errors.Is(werr, os.ErrDeadlineExceeded) {
			return fmt.Errorf("connect: %w", context.DeadlineExceeded)
		}
		return fmt.Errorf("connect: %w", werr)
	}
	return cerr
}

func sockaddr(a netip.AddrPort, v6 bool) unix.Sockaddr {
	if v6 {
		return &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
	}
	return &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
}
