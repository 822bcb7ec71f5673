package dnsproxy

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// steerToNewest makes the UDP socket's SO_REUSEPORT group hand every new
// datagram to the group's second socket, which
// is the newer server's while two overlap, instead of spreading them by
// hash. The group keeps its sockets in bind order; when one leaves, the
// last takes its slot. So while an old and a new server share the port the
// new one (index 1) gets everything and the old one only finishes what it
// already has (Drain); alone, either is index 0 and the out-of-range
// answer falls back to the kernel's hash over the one socket. The program
// belongs to the group: the newest server's attach replaces the old one's.
// A third overlapping server would get nothing until the oldest leaves.
func steerToNewest(sc syscall.Conn) error {
	rc, err := sc.SyscallConn()
	if err != nil {
		return fmt.Errorf("dnsproxy: steer SO_REUSEPORT group: %w", err)
	}
	prog := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 1}}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: (*unix.SockFilter)(unsafe.Pointer(&prog[0]))}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &fprog)
	}); err != nil {
		return fmt.Errorf("dnsproxy: steer SO_REUSEPORT group: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("dnsproxy: steer SO_REUSEPORT group (SO_ATTACH_REUSEPORT_CBPF): %w", serr)
	}
	return nil
}
