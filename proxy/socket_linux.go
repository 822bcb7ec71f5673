package proxy

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h).
const ip6tSOOriginalDst = 80

// OriginalDst returns where the client of an accepted, redirected
// connection meant to go: SO_ORIGINAL_DST (IPv4 conntrack), else
// IP6T_SO_ORIGINAL_DST (IPv6), else the socket's local address (a
// connection that was not NATed, as on 15008, or TPROXY). The result is
// unmapped (IPv4 as 4 bytes).
func OriginalDst(c net.Conn) netip.AddrPort {
	local := addrPortOf(c.LocalAddr())
	sc, ok := c.(syscall.Conn)
	if !ok {
		return local
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return local
	}
	var dst netip.AddrPort
	_ = rc.Control(func(fd uintptr) {
		if ap, err := origDst4(int(fd)); err == nil {
			dst = ap
			return
		}
		if ap, err := origDst6(int(fd)); err == nil {
			dst = ap
		}
	})
	if dst.IsValid() {
		return dst
	}
	return local
}

func getsockopt(fd, level, opt int, buf []byte) (int, error) {
	l := uint32(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return 0, e
	}
	return int(l), nil
}

// origDst4 reads a struct sockaddr_in.
func origDst4(fd int) (netip.AddrPort, error) {
	var b [unix.SizeofSockaddrInet4]byte
	n, err := getsockopt(fd, unix.SOL_IP, unix.SO_ORIGINAL_DST, b[:])
	if err != nil {
		return netip.AddrPort{}, err
	}
	if n < 8 || binary.NativeEndian.Uint16(b[0:2]) != unix.AF_INET {
		return netip.AddrPort{}, fmt.Errorf("proxy: SO_ORIGINAL_DST: unexpected sockaddr")
	}
	port := binary.BigEndian.Uint16(b[2:4])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port), nil
}

// origDst6 reads a struct sockaddr_in6.
func origDst6(fd int) (netip.AddrPort, error) {
	var b [unix.SizeofSockaddrInet6]byte
	n, err := getsockopt(fd, unix.SOL_IPV6, ip6tSOOriginalDst, b[:])
	if err != nil {
		return netip.AddrPort{}, err
	}
	if n < 24 || binary.NativeEndian.Uint16(b[0:2]) != unix.AF_INET6 {
		return netip.AddrPort{}, fmt.Errorf("proxy: IP6T_SO_ORIGINAL_DST: unexpected sockaddr")
	}
	port := binary.BigEndian.Uint16(b[2:4])
	return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), port), nil
}

// addrPortOf converts a TCP address, unmapped; zero for anything else.
func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// tcpConsumed is how many bytes the application has read from c so far:
// the kernel's count of bytes received (TCP_INFO tcpi_bytes_received)
// less those still queued (SIOCINQ). 0 when unknown (closed socket).
func tcpConsumed(c *net.TCPConn) int64 {
	s := readSock(c, true)
	defer sockReadPool.Put(s)
	if !s.ok {
		return 0
	}
	return max(int64(s.info.Bytes_received)-int64(s.inq), 0)
}

// tcpAcked is how many bytes written to c its peer has acknowledged
// (TCP_INFO tcpi_bytes_acked). 0 when unknown.
//
// The kernel's count includes the SYN and, once acknowledged, our FIN:
// each takes a sequence number. Left in, every connection's live estimate
// was a byte ahead of what the copy counts at its end, and the flush,
// which only ever adds, kept that byte (TestSocketCounts).
func tcpAcked(c *net.TCPConn) int64 {
	s := readSock(c, false)
	defer sockReadPool.Put(s)
	if !s.ok {
		return 0
	}
	n := int64(s.info.Bytes_acked) - 1
	switch s.info.State {
	case unix.BPF_TCP_FIN_WAIT2, unix.BPF_TCP_TIME_WAIT, unix.BPF_TCP_CLOSE:
		n-- // our FIN was acknowledged
	}
	return max(n, 0)
}

// sockRead is one read of a socket's TCP_INFO (and SIOCINQ), pooled with
// its callback: the flusher asks every open connection each second, and
// unix.GetsockoptTCPInfo's fresh struct and a closure per call were 60 MiB
// of garbage in a soak holding 10,000 tunnels for 10 s.
type sockRead struct {
	info unix.TCPInfo
	inq  int
	// withInq: read SIOCINQ too; ok: everything asked for was read.
	withInq, ok bool
	fn          func(fd uintptr)
}

var sockReadPool = sync.Pool{New: func() any {
	s := new(sockRead)
	s.fn = s.read
	return s
}}

// readSock reads c's counts into a pooled sockRead; put it back after.
func readSock(c *net.TCPConn, withInq bool) *sockRead {
	s := sockReadPool.Get().(*sockRead)
	s.withInq, s.ok = withInq, false
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(s.fn)
	}
	return s
}

func (s *sockRead) read(fd uintptr) {
	l := uint32(unsafe.Sizeof(s.info))
	// getsockopt on TCP_INFO never blocks: the raw form skips the
	// runtime's syscall bookkeeping.
	if _, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&s.info)), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
		return
	}
	if s.withInq {
		var err error
		if s.inq, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ); err != nil {
			return
		}
	}
	s.ok = true
}
