package netns

import (
	"time"

	"golang.org/x/sys/unix"
)

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

// SetIdleForTest sets how long h keeps pooled sockets without a dial.
func SetIdleForTest(h *Handle, d time.Duration) { h.idle = d }

// PooledForTest is how many sockets h's pool holds.
func PooledForTest(h *Handle) int {
	n := 0
	for _, ch := range h.pool.ready {
		n += len(ch)
	}
	return n
}

// RefillingForTest says whether a refill of h's pool is running.
func RefillingForTest(h *Handle) bool { return h.pool.refilling.Load() }

// PoolDepth is how many sockets of a kind the pool keeps.
const PoolDepth = poolDepth
