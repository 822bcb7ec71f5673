package netns

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Dial's sockets come from a small pool per Handle, so that a dial into a pod
// does not pay for entering the namespace.
//
// Entering costs a setns in and a setns back on a locked thread (Do): ~12 µs
// of CPU per dial on the benchmark machine (BenchmarkSocket minus a plain
// socket and close). The pool pays that once per batch: a refill enters the
// namespace once and makes up to poolDepth sockets of each kind (family ×
// type) dials have asked for. A dial that finds a socket ready takes it with
// one channel receive: no setns, no thread switch, no wakeup on its path. A
// dial that takes the pool down to refillAt starts a refill on a goroutine
// of its own (one filler at a time per Handle), which runs when the dialling
// goroutine next waits. A dial that finds the pool empty (the first of its
// kind, after idle, a burst larger than the pool) makes its own socket
// through Do, as every dial did before, and while in the namespace slowFill
// more.
//
// A pooled socket is what a fresh one would be: nothing about a socket is
// fixed at creation except its namespace, family and type, which are the
// pool's key. Options, bind and connect are applied by the dial that takes it.
//
// No thread stays in the namespace: fillers enter and leave like Do, and a
// thread that cannot switch back is discarded as in Do. A pool without a dial
// for idleTimeout is closed, so quiet pods hold no sockets; Close closes it.
//
// Why not a goroutine locked in the namespace that makes sockets on request
// (a socket factory thread per namespace)? Measured with the same pool in
// front of it: waking a locked goroutine and getting its answer costs two
// thread hand-offs, ~10 µs of CPU per round trip here against ~5 µs for an
// empty Do (a goroutine and two setns); on a loaded node each hand-off also
// waits for the kernel to run that one thread while it holds a P; and it
// keeps a thread per busy pod. See bench/README.md, Mesh.

// sockKind is a socket family and type the pool holds.
type sockKind uint8

const (
	tcp4 sockKind = iota
	tcp6
	udp4
	udp6
	numKinds
)

func kindOf(family, sotype int) sockKind {
	k := tcp4
	if family == unix.AF_INET6 {
		k = tcp6
	}
	if sotype == unix.SOCK_DGRAM {
		k += udp4
	}
	return k
}

// socket makes a non-blocking, close-on-exec socket of kind k in the
// calling thread's namespace.
func (k sockKind) socket() (int, error) {
	family, sotype := unix.AF_INET, unix.SOCK_STREAM
	if k == tcp6 || k == udp6 {
		family = unix.AF_INET6
	}
	if k == udp4 || k == udp6 {
		sotype = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(family, sotype|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	return fd, nil
}

const (
	// poolDepth is how many ready sockets the pool keeps per kind in use.
	poolDepth = 16
	// refillAt is the pool length at which a dial starts a refill, so a
	// refill makes about poolDepth-refillAt sockets per setns pair.
	refillAt = poolDepth / 2
	// slowFill is how many sockets per kind a dial that found the pool
	// empty makes ahead, on top of its own.
	slowFill = 4
	// defaultIdle is how long a pool is kept without a dial.
	defaultIdle = 30 * time.Second
)

// pool is a Handle's ready sockets. The channels and counters are used
// without h.mu; h.mu (read) is held to put sockets in, and (write) to close
// the pool, so that no socket goes in after Close emptied it.
type pool struct {
	// ready holds sockets per kind. Whoever receives an fd owns it.
	ready [numKinds]chan int
	// wanted has bit k set once a dial asked for kind k; refills make
	// only wanted kinds. Cleared when the pool goes idle.
	wanted atomic.Uint32
	// refilling is set while a refill runs.
	refilling atomic.Bool
	// lastUse is the time of the last dial (UnixNano), for the idle close.
	lastUse atomic.Int64
	// idle is the timer that closes the pool when unused. Created and
	// reset by refills (one at a time), stopped and reset under h.mu
	// held for writing.
	idle *time.Timer
}

// socket makes a non-blocking, close-on-exec socket in h's namespace, from
// the pool if one is ready.
func (h *Handle) socket(family, sotype int) (int, error) {
	k := kindOf(family, sotype)
	p := &h.pool
	p.lastUse.Store(time.Now().UnixNano())
	select {
	case fd := <-p.ready[k]:
		if len(p.ready[k]) <= refillAt {
			h.startRefill()
		}
		return fd, nil
	default:
	}
	p.wanted.Or(uint32(1) << k)
	// The pool is empty: make this dial's socket, and while in the
	// namespace a few more unless a refill is on its way (a burst, or
	// the first dials after idle).
	refill := p.refilling.CompareAndSwap(false, true)
	var made [numKinds][]int
	fd := -1
	err := h.Do(func() error {
		var err error
		fd, err = k.socket()
		if err == nil && refill {
			made = h.makeAhead(slowFill)
		}
		return err
	})
	if refill {
		h.put(&made)
		p.refilling.Store(false)
	}
	if err != nil {
		return -1, err
	}
	return fd, nil
}

// enterAndDo runs fn with the calling goroutine's thread in h, if it can
// enter. The caller is a goroutine of its own that returns right after: if
// the thread cannot switch back, it stays locked and the runtime discards it
// when that goroutine exits (Do's rule, without Do's extra goroutine).
func (h *Handle) enterAndDo(fn func()) {
	orig, err := home()
	if err != nil {
		return
	}
	runtime.LockOSThread()
	if err := h.enter(); err != nil {
		runtime.UnlockOSThread()
		return
	}
	fn()
	if err := h.leave(orig); err != nil {
		return
	}
	runtime.UnlockOSThread()
}

// startRefill starts a refill unless one is running.
func (h *Handle) startRefill() {
	if h.pool.refilling.CompareAndSwap(false, true) {
		go h.refill()
	}
}

// refill enters h once and tops up every wanted kind. A kind whose socket
// fails is not made ahead any more: the next dial of that kind makes its own
// and gets the error itself.
func (h *Handle) refill() {
	p := &h.pool
	defer p.refilling.Store(false)
	var made [numKinds][]int
	h.enterAndDo(func() { made = h.makeAhead(poolDepth) })
	h.put(&made)
}

// makeAhead makes up to n sockets of each wanted kind, without overfilling the
// pool, in the calling thread's namespace. A kind whose socket fails is not
// made ahead any more: the next dial of that kind makes its own and gets the
// error itself.
func (h *Handle) makeAhead(n int) (made [numKinds][]int) {
	p := &h.pool
	for k := range numKinds {
		if p.wanted.Load()&(uint32(1)<<k) == 0 {
			continue
		}
		for range min(n, cap(p.ready[k])-len(p.ready[k])) {
			fd, err := k.socket()
			if err != nil {
				p.wanted.And(^(uint32(1) << k))
				break
			}
			made[k] = append(made[k], fd)
		}
	}
	return made
}

// put adds made to the pool, or closes them after Close.
func (h *Handle) put(made *[numKinds][]int) {
	p := &h.pool
	h.mu.RLock()
	defer h.mu.RUnlock()
	for k, fds := range made {
		for _, fd := range fds {
			if h.closed {
				unix.Close(fd)
				continue
			}
			select {
			case p.ready[k] <- fd:
			default: // cannot happen: only the one refill puts
				unix.Close(fd)
			}
		}
	}
	if !h.closed {
		h.armIdle()
	}
}

// armIdle (re)starts the idle timer. Called by the one running refill with
// h.mu held for reading, which keeps closeIfIdle and Close out.
func (h *Handle) armIdle() {
	if h.pool.idle == nil {
		h.pool.idle = time.AfterFunc(h.idleTimeout(), h.closeIfIdle)
		return
	}
	h.pool.idle.Reset(h.idleTimeout())
}

func (h *Handle) idleTimeout() time.Duration {
	if h.idle > 0 {
		return h.idle
	}
	return defaultIdle
}

// closeIfIdle closes the pooled sockets if no dial came for idleTimeout,
// and otherwise checks again when it would be.
func (h *Handle) closeIfIdle() {
	p := &h.pool
	since := time.Since(time.Unix(0, p.lastUse.Load()))
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	if rest := h.idleTimeout() - since; rest > 0 {
		p.idle.Reset(rest)
		return
	}
	p.wanted.Store(0)
	p.drain()
}

// drain closes the pooled sockets no dial took.
func (p *pool) drain() {
	for _, ch := range p.ready {
		for {
			select {
			case fd := <-ch:
				unix.Close(fd)
				continue
			default:
			}
			break
		}
	}
}
