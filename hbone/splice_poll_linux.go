package hbone

import (
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The c→tunnel direction of SpliceAsync for a TCP socket waits for
// readability in an epoll set of our own, not in a goroutine parked in
// the runtime's poller: a goroutine descriptor is never freed by Go (about
// 490 bytes kept for reuse), so one goroutine per open tunnel leaves a
// wave's peak behind for good, and its stack is most of an idle tunnel's
// memory.
//
// A watched socket is registered once, edge-triggered (EPOLLIN|EPOLLRDHUP|
// EPOLLET), and is in one of three states. idle: no goroutine. running: a
// worker reads it without waiting (pollReader with nowait) and writes to
// the tunnel (which may block on flow control: the worker is busy then,
// not idle) until EAGAIN, and goes idle. An edge that comes while it runs
// sets pending, and the worker reads again instead of going idle, so bytes
// that arrive between its EAGAIN and its going idle are not left unread
// (what a level-triggered EPOLLONESHOT entry re-armed with EPOLL_CTL_MOD
// would give, without an epoll_ctl per wake-up). ended: deregistered; the
// splice is told.
//
// The epoll entry's data is a slot and generation in the registration
// table, never the descriptor: an event still queued for a registration
// that ended (its descriptor possibly reused since) finds a different
// generation and is dropped. The descriptor itself is touched only through
// syscall.RawConn, which holds it open for the call.
//
// The set's own descriptor waits in the runtime's poller (it is readable
// while events are ready), so the waiter is an ordinary parked goroutine,
// woken by the scheduler's netpoll, not a thread blocked in epoll_wait.

const (
	wsRunning = iota
	wsIdle
	wsEnded
)

// sockWatch is one watched socket: the c→t direction of one splice.
type sockWatch struct {
	s    *splice
	rc   syscall.RawConn
	pr   *pollReader
	size int // next read's buffer size

	mu      sync.Mutex
	state   uint8 // wsRunning, wsIdle, wsEnded; under mu
	pending bool  // an edge came while running; under mu
	added   bool  // in the epoll set; under mu
	aborted bool  // abort came while running; under mu

	slot, gen uint32 // the registration's id (splicePoll.slots)

	waited   bool               // linger's wait has begun
	deadline time.Time          // c's read deadline while lingering
	waitFn   func(uintptr) bool // w.waitReadable, bound once

	// epoll_ctl through rc.Control: op and its error, ctlFn bound once.
	op    int
	ctlFn func(uintptr)
	ctlEr error
}

// newSockWatch returns a watch for a TCP c, or nil (the caller copies on
// a goroutine) when c is not one or the epoll set cannot be had.
func newSockWatch(s *splice) *sockWatch {
	tc, ok := s.c.(*net.TCPConn)
	if !ok {
		return nil
	}
	if splicePoll.init() != nil {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	pr := newPollReader(tc)
	if pr == nil {
		return nil
	}
	pr.nowait = true
	w := &sockWatch{s: s, rc: rc, pr: pr, size: spliceStartBuf, state: wsRunning}
	w.ctlFn = w.ctl
	w.waitFn = w.waitReadable
	splicePoll.register(w)
	return w
}

// start registers the socket and runs the first reads on the caller's
// goroutine (the client's first bytes are often there already).
func (w *sockWatch) start() {
	w.mu.Lock()
	err := w.epollCtl(unix.EPOLL_CTL_ADD)
	w.added = err == nil
	if err != nil {
		w.state = wsEnded
	}
	w.mu.Unlock()
	if err != nil {
		w.end(err)
		return
	}
	w.run()
}

// run reads c into t until c has nothing more for now (then the watch goes
// idle) or the direction ends. The state is wsRunning.
func (w *sockWatch) run() {
	t := w.s.t
	for {
		bp, n, err := w.pr.read(w.size)
		if err == errWouldBlock {
			w.size = spliceStartBuf
			switch w.linger() {
			case lingerMore:
				continue
			case lingerEnded:
				return
			}
			if w.goIdle() {
				return
			}
			continue
		}
		if err != nil {
			w.endFromRun(err)
			return
		}
		_, werr := t.write((*bp)[:n], &splicePoll)
		full := n == len(*bp)
		putBuf(bp)
		if werr != nil {
			w.endFromRun(werr)
			return
		}
		if full && w.size < spliceMaxBuf {
			w.size *= 4 // more is queued: read bigger (as copyToTunnel)
		}
	}
}

// lingerFor is how long a socket that has just been read waits for its
// next bytes in the runtime's poller, on the goroutine that read it,
// before it goes back to the epoll set. A request/response connection
// then costs one wake-up per message, as a blocking read does, instead of
// the epoll set's two (its waiter, then a worker) and an epoll_wait
// (SpliceRR1K: ~48,500 CPU-ns per request with a goroutine parked in a
// read, ~66,000 through the epoll set); a socket quiet for longer, like
// most of a node's tunnels, holds no goroutine. A burst of new tunnels
// holds about its arrival rate times lingerFor goroutines at once.
const lingerFor = 50 * time.Millisecond

// maxLingering bounds the sockets that linger at once (each on a
// goroutine), so that a burst of new tunnels, which all linger after
// their first bytes, leaves at most this many goroutine descriptors
// behind (the runtime keeps every one it made); the others go idle in
// the epoll set at once.
const maxLingering = 128

var lingering atomic.Int64

const (
	lingerIdle  = iota // nothing came: go idle in the epoll set
	lingerMore         // readable: read again
	lingerEnded        // the direction ended
)

// linger waits up to lingerFor for c to become readable, out of the epoll
// set meanwhile (an edge there would wake its waiter for nothing), and
// puts the socket back in the set when nothing came. Adding it back
// reports bytes that came in between as an edge, which goIdle sees as
// pending.
func (w *sockWatch) linger() int {
	w.mu.Lock()
	if w.aborted || w.pending {
		w.mu.Unlock()
		return lingerIdle // goIdle ends the direction or reads again
	}
	if lingering.Add(1) > maxLingering {
		lingering.Add(-1)
		w.mu.Unlock()
		return w.cool() // it may have lingered before, out of the set
	}
	defer lingering.Add(-1)
	if w.added {
		w.epollCtl(unix.EPOLL_CTL_DEL)
		w.added = false
	}
	w.mu.Unlock()
	splicePoll.block() // not a worker the queue can count on meanwhile
	// The deadline stays set while the socket is busy and moves only when
	// less than half of lingerFor is left: a timer update per wait would
	// cost more than it measures.
	var err error
	if now := time.Now(); w.deadline.Sub(now) < lingerFor/2 {
		w.deadline = now.Add(lingerFor)
		err = w.s.c.SetReadDeadline(w.deadline)
	}
	if err == nil {
		w.waited = false
		err = w.rc.Read(w.waitFn)
	}
	splicePoll.unblock()
	if err == nil {
		return lingerMore
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		w.endFromRun(err) // closed under the wait (an abort closes c)
		return lingerEnded
	}
	return w.cool()
}

// cool ends lingering: the read deadline cleared and the socket back in
// the epoll set (unless an abort came, which goIdle then carries out).
func (w *sockWatch) cool() int {
	var err error
	if !w.deadline.IsZero() {
		w.deadline = time.Time{}
		err = w.s.c.SetReadDeadline(time.Time{})
	}
	w.mu.Lock()
	if err == nil && !w.added && !w.aborted {
		err = w.epollCtl(unix.EPOLL_CTL_ADD)
		w.added = err == nil
	}
	w.mu.Unlock()
	if err != nil {
		w.endFromRun(err)
		return lingerEnded
	}
	return lingerIdle
}

// waitReadable is linger's RawConn.Read callback: the first call comes
// right after a read found the socket empty, so it asks the runtime to
// wait; the second comes once the socket is readable.
func (w *sockWatch) waitReadable(uintptr) bool {
	if !w.waited {
		w.waited = true
		return false
	}
	return true
}

// goIdle ends a run that found the socket empty: it reports false when an
// edge came meanwhile (read again), and ends the direction if an abort
// came.
func (w *sockWatch) goIdle() bool {
	w.mu.Lock()
	switch {
	case w.aborted:
		w.state = wsEnded
		w.mu.Unlock()
		w.end(net.ErrClosed)
		return true
	case w.pending:
		w.pending = false
		w.mu.Unlock()
		return false
	}
	w.state = wsIdle
	w.mu.Unlock()
	return true
}

func (w *sockWatch) endFromRun(err error) {
	w.mu.Lock()
	w.state = wsEnded
	w.mu.Unlock()
	w.end(err)
}

// end deregisters the socket and ends the splice's c→t direction; it runs
// once, after the state became wsEnded.
func (w *sockWatch) end(err error) {
	w.mu.Lock()
	added := w.added
	w.added = false
	if added {
		w.epollCtl(unix.EPOLL_CTL_DEL) // fails only if c was closed, which removed it
	}
	w.mu.Unlock()
	splicePoll.unregister(w)
	w.s.endIn(err)
}

// abort ends the direction because the other one failed: at once when the
// socket is idle (nobody else will), else by closing c under the worker,
// whose next read fails or which sees aborted when it would go idle.
func (w *sockWatch) abort() {
	w.mu.Lock()
	switch w.state {
	case wsIdle:
		w.state = wsEnded
		w.mu.Unlock()
		w.end(net.ErrClosed) // closes c
		return
	case wsRunning:
		w.aborted = true
	}
	w.mu.Unlock()
	w.s.c.Close()
}

// fire runs a watch whose socket became readable (or, from the sweep, was
// closed) on a worker if it is idle, and makes a running one read again.
func (w *sockWatch) fire() {
	w.mu.Lock()
	switch w.state {
	case wsRunning:
		w.pending = true
		w.mu.Unlock()
		return
	case wsEnded:
		w.mu.Unlock()
		return
	}
	w.state = wsRunning
	w.mu.Unlock()
	splicePoll.dispatch(w)
}

func (w *sockWatch) epollCtl(op int) error {
	w.op, w.ctlEr = op, nil
	if err := w.rc.Control(w.ctlFn); err != nil {
		return err
	}
	return w.ctlEr
}

func (w *sockWatch) ctl(fd uintptr) {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET,
		Fd: int32(w.slot), Pad: int32(w.gen)}
	if err := unix.EpollCtl(splicePoll.fd, w.op, int(fd), &ev); err != nil {
		w.ctlEr = os.NewSyscallError("epoll_ctl", err)
	}
}

// errWouldBlock is a nowait pollReader's answer when the socket is empty.
var errWouldBlock = errors.New("hbone: would block")

// splicePoll is the process's epoll set for watched sockets: one waiter
// goroutine, and workers that take readable sockets from a queue. At most
// maxRunning workers run at once, not counting those waiting for flow
// control (which may wait on a socket only a worker can read: the peer
// may be this process), so a burst (10,000 sockets reaching EOF at once)
// does not start a goroutine each: the runtime never frees a goroutine's
// descriptor, and the peak would stay. A worker with nothing to do waits
// workerIdle for more before it exits.
var splicePoll epollSet

const (
	workerIdle = 2 * time.Second
	// sweepEvery is how often idle sockets are checked for having been
	// closed under the watch (see SpliceAsync), while any are watched.
	sweepEvery = time.Second
	queueLen   = 1024
)

var maxRunning = int64(max(4, 2*runtime.GOMAXPROCS(0)))

type epollSet struct {
	once sync.Once
	err  error
	fd   int      // the epoll set
	file *os.File // fd, in the runtime's poller
	rc   syscall.RawConn
	evs  [128]unix.EpollEvent
	nev  int
	fn   func(uintptr) bool // e.poll, bound once

	mu    sync.Mutex // register and unregister
	slots atomic.Pointer[[]atomic.Pointer[sockWatch]]
	free  []uint32 // under mu
	next  uint32   // under mu; slots [next, len) never used since the table was reset
	gen   uint32   // under mu
	n     atomic.Int64
	sweep *time.Timer // under mu; runs while n > 0

	queue    chan poolTask // readable sockets (and ending drains) for the workers
	omu      sync.Mutex
	overflow []poolTask // under omu; what did not fit in queue
	nover    atomic.Int64
	running  atomic.Int64 // workers not idle and not waiting for flow control
	idle     atomic.Int64 // workers waiting for the queue
}

func (e *epollSet) init() error {
	e.once.Do(func() {
		fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			e.err = os.NewSyscallError("epoll_create1", err)
			return
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			e.err = os.NewSyscallError("fcntl", err)
			return
		}
		// Non-blocking, so os.NewFile puts it in the runtime's poller.
		e.file = os.NewFile(uintptr(fd), "hbone-splice-epoll")
		rc, err := e.file.SyscallConn()
		if err != nil {
			e.file.Close()
			e.err = err
			return
		}
		e.fd, e.rc = fd, rc
		e.fn = e.poll
		e.queue = make(chan poolTask, queueLen)
		e.sweep = time.AfterFunc(time.Hour, e.sweepClosed)
		e.sweep.Stop()
		go e.wait()
	})
	return e.err
}

// register gives w a slot and a generation.
func (e *epollSet) register(w *sockWatch) {
	e.mu.Lock()
	e.gen++
	w.gen = e.gen
	tab := e.slots.Load()
	var slot uint32
	switch {
	case len(e.free) > 0:
		slot = e.free[len(e.free)-1]
		e.free = e.free[:len(e.free)-1]
	default:
		if tab == nil || int(e.next) == len(*tab) {
			size := 64
			if tab != nil {
				size = 2 * len(*tab)
			}
			grown := make([]atomic.Pointer[sockWatch], size)
			if tab != nil {
				for i := range *tab {
					grown[i].Store((*tab)[i].Load())
				}
			}
			tab = &grown
			e.slots.Store(tab)
		}
		slot = e.next
		e.next++
	}
	w.slot = slot
	(*tab)[slot].Store(w)
	if e.n.Add(1) == 1 {
		e.sweep.Reset(sweepEvery)
	}
	e.mu.Unlock()
}

// unregister frees w's slot. When the last one goes the table is dropped,
// so a burst of tunnels does not keep its size.
func (e *epollSet) unregister(w *sockWatch) {
	e.mu.Lock()
	tab := e.slots.Load()
	(*tab)[w.slot].Store(nil)
	if e.n.Add(-1) == 0 {
		e.slots.Store(nil)
		e.free, e.next = nil, 0
		e.sweep.Stop()
	} else {
		e.free = append(e.free, w.slot)
	}
	e.mu.Unlock()
}

func (e *epollSet) lookup(slot, gen uint32) *sockWatch {
	tab := e.slots.Load()
	if tab == nil || int(slot) >= len(*tab) {
		return nil
	}
	w := (*tab)[slot].Load()
	if w == nil || w.gen != gen {
		return nil // ended; the event was queued before it was removed
	}
	return w
}

// poll takes the ready events without waiting; false (nothing ready) parks
// the waiter in the runtime's poller until the set is readable. (It must
// ask even right after a wake-up: RawConn.Read forgets a readiness edge
// that came before it was called.)
func (e *epollSet) poll(fd uintptr) bool {
	n, err := unix.EpollWait(int(fd), e.evs[:], 0)
	if err == unix.EINTR || n <= 0 {
		return false
	}
	e.nev = n
	return true
}

func (e *epollSet) wait() {
	for {
		if err := e.rc.Read(e.fn); err != nil {
			panic("hbone: splice epoll set: " + err.Error()) // never closed: a bug
		}
		for i := range e.nev {
			ev := &e.evs[i]
			if w := e.lookup(uint32(ev.Fd), uint32(ev.Pad)); w != nil {
				w.fire()
			}
		}
	}
}

// sweepClosed fires idle watches whose socket was closed under them (by a
// caller that closed c instead of the tunnel): the kernel dropped it from
// the set without an event. The worker's read then fails and ends the
// splice.
func (e *epollSet) sweepClosed() {
	tab := e.slots.Load()
	if tab != nil {
		for i := range *tab {
			w := (*tab)[i].Load()
			if w == nil {
				continue
			}
			w.mu.Lock()
			idle := w.state == wsIdle
			w.mu.Unlock()
			if idle && w.rc.Control(noControl) != nil {
				w.fire()
			}
		}
	}
	e.mu.Lock()
	if e.n.Load() > 0 {
		e.sweep.Reset(sweepEvery)
	}
	e.mu.Unlock()
}

func noControl(uintptr) {}

// dispatch queues w for a worker and starts one if none is idle and
// fewer than maxRunning run. It never waits: callers include the workers
// themselves (an abort passes an end on) and connections' read loops. When
// the queue is full (a burst: a wave of tunnels ending at once) w waits in
// the overflow list, which the workers empty before they go idle; a
// goroutine each would leave the burst's goroutine descriptors behind.
func (e *epollSet) dispatch(w poolTask) {
	select {
	case e.queue <- w:
	default:
		e.omu.Lock()
		e.overflow = append(e.overflow, w)
		e.nover.Add(1)
		e.omu.Unlock()
	}
	e.kick()
}

// take takes a task without waiting: from the queue, else the overflow.
func (e *epollSet) take() poolTask {
	select {
	case w := <-e.queue:
		return w
	default:
	}
	if e.nover.Load() == 0 {
		return nil
	}
	e.omu.Lock()
	defer e.omu.Unlock()
	n := len(e.overflow)
	if n == 0 {
		return nil
	}
	w := e.overflow[0]
	e.overflow[0] = nil
	e.overflow = e.overflow[1:]
	if n == 1 {
		e.overflow = nil // the burst is over: drop its backing array
	}
	e.nover.Add(-1)
	return w
}

// poolTask is a worker's job: a readable socket (*sockWatch) or a tunnel
// with only its end to pass on (*Tunnel, see kickDrain).
type poolTask interface{ run() }

// run is a drain on a splice worker.
func (t *Tunnel) run() { t.drain() }

// runEnding runs t's drain on a splice worker, or reports false when there
// are none (the caller starts a goroutine).
func runEnding(t *Tunnel) bool {
	if splicePoll.init() != nil {
		return false
	}
	splicePoll.dispatch(t)
	return true
}

// kick starts a worker if there is queued work, no idle worker to take it
// and room. A worker that goes idle or exits checks the queue after it
// counted itself, and kick checks the counts after the queueing, so one of
// them sees the other.
func (e *epollSet) kick() {
	for len(e.queue)+int(e.nover.Load()) > 0 && e.idle.Load() == 0 {
		n := e.running.Load()
		if n >= maxRunning {
			return
		}
		if e.running.CompareAndSwap(n, n+1) {
			go e.worker()
			return
		}
	}
}

func (e *epollSet) block() {
	e.running.Add(-1)
	e.kick()
}

func (e *epollSet) unblock() { e.running.Add(1) }

func (e *epollSet) worker() {
	var idle *time.Timer
	for {
		if w := e.take(); w != nil {
			w.run()
			continue
		}
		e.running.Add(-1)
		e.idle.Add(1)
		if idle == nil {
			idle = time.NewTimer(workerIdle)
		} else {
			idle.Reset(workerIdle)
		}
		select {
		case w := <-e.queue:
			e.running.Add(1)
			e.idle.Add(-1)
			w.run()
			continue
		case <-idle.C:
		}
		e.idle.Add(-1)
		// Work queued while this one was leaving is this one's unless a
		// worker can be started for it.
		if w := e.take(); w != nil {
			e.running.Add(1)
			w.run()
			continue
		}
		e.kick()
		return
	}
}
