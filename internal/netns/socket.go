package netns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"

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

// Listen opens a TCP listener on addr inside h's namespace.
func (h *Handle) Listen(ctx context.Context, addr netip.AddrPort, o SockOpts) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() error {
		var err error
		lc := net.ListenConfig{Control: o.Control}
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
// target namespace. The whole connect runs inside Do, so each in-flight dial
// holds one locked OS thread until it completes or ctx ends; bound ctx.
func (h *Handle) Dial(ctx context.Context, network string, addr netip.AddrPort, o SockOpts) (net.Conn, error) {
	d := net.Dialer{Control: o.Control}
	switch {
	case network != "tcp" && network != "udp":
		return nil, fmt.Errorf("netns: dial: unsupported network %q", network)
	case !o.LocalAddr.IsValid():
	case network == "tcp":
		d.LocalAddr = net.TCPAddrFromAddrPort(o.LocalAddr)
	default:
		d.LocalAddr = net.UDPAddrFromAddrPort(o.LocalAddr)
	}
	var c net.Conn
	err := h.Do(func() error {
		var err error
		c, err = d.DialContext(ctx, network, addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netns: dial %s %s in %s: %w", network, addr, h, err)
	}
	return c, nil
}
