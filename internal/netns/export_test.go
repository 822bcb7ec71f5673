package netns

import "golang.org/x/sys/unix"

// SetRestoreForTest replaces the switch back to the original namespace in Do,
// so tests can exercise the failure path.
func SetRestoreForTest(h *Handle, restore func(origFD int) error) { h.restore = restore }

// SocketForTest makes a TCP (or UDP) socket of the family in h's namespace,
// as Dial does before binding and connecting.
func SocketForTest(h *Handle, v6, udp bool) (int, error) {
	family, sotype := unix.AF_INET, unix.SOCK_STREAM
	if v6 {
		family = unix.AF_INET6
	}
	if udp {
		sotype = unix.SOCK_DGRAM
	}
	return h.socket(family, sotype)
}
