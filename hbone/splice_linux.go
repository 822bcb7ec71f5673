package hbone

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const canWaitReadable = true

// waitReadable blocks until the socket has bytes, EOF or an error pending,
// without a read buffer: it peeks one byte into a stack array.
func waitReadable(rc syscall.RawConn) error {
	return rc.Read(func(fd uintptr) bool {
		for {
			var b [1]byte
			_, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
				unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
			switch errno {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false // not ready: the poller waits and calls again
			}
			return true // data, EOF or an error that the next Read reports
		}
	})
}
