// Package netns is the one place that enters Linux network namespaces. A Handle
// is an open netns file descriptor; Handle.Do runs a function with the calling
// OS thread switched into that namespace, and Listen, ListenPacket and Dial
// create sockets there (a socket stays in the namespace it was created in, so
// only socket creation needs to enter it; Dial takes sockets made ahead in
// batches, pool.go). SockOpts puts SO_MARK,
// SO_REUSEPORT and IP(V6)_TRANSPARENT+FREEBIND on those sockets through the
// net.ListenConfig / net.Dialer Control hook.
//
// It is not a namespace manager: it does not create, name or delete network
// namespaces (tests use internal/netns/netnstest for that), and it knows nothing
// about pods.
package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNotNetns is returned (wrapped) when a path or fd is not a network
// namespace.
var ErrNotNetns = errors.New("not a network namespace")

// ErrRestore is returned (wrapped) by Handle.Do when the thread could not be
// switched back to its original namespace. The thread is then discarded by the
// Go runtime; the process itself is unaffected.
var ErrRestore = errors.New("switching back to the original network namespace failed")

// ErrClosed is returned (wrapped) by Do, Dial and the listeners after
// Handle.Close.
var ErrClosed = errors.New("network namespace handle is closed")

// ID identifies a network namespace: two handles refer to the same namespace
// iff their IDs are equal (the nsfs device and inode of the fd).
type ID struct {
	Dev uint64
	Ino uint64
}

func (id ID) String() string { return fmt.Sprintf("netns[dev=%d,ino=%d]", id.Dev, id.Ino) }

// Handle is an open network namespace. It is safe for concurrent use; Do may
// run concurrently on several goroutines. A nil *Handle means "the namespace the
// process is already in": Do runs fn directly and the socket helpers create
// ordinary sockets (ztunnel's dedicated mode, and tests).
type Handle struct {
	f  *os.File
	fd int // f's, read once: os.File.Fd may make a syscall
	id ID

	// mu guards closed. Entering the namespace holds it for reading, so
	// Close cannot close the fd (and the process reuse its number) under
	// a setns; see pool for the rest.
	mu     sync.RWMutex
	closed bool
	// pool holds sockets made ahead for Dial (pool.go).
	pool pool
	// idle overrides the pool's idle timeout when positive. Tests only
	// (export_test.go).
	idle time.Duration

	// restore, when non-nil, replaces the setns back to the original
	// namespace in Do. Tests only (export_test.go), to exercise the failure
	// path; nil in production.
	restore func(origFD int) error
}

// Open opens the network namespace at path, e.g. /var/run/netns/NAME or
// /proc/PID/ns/net.
func Open(path string) (*Handle, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("netns: open %s: %w", path, err)
	}
	h, err := fromFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("netns: %s: %w", path, err)
	}
	return h, nil
}

// FromFD wraps an fd that refers to a network namespace, e.g. one received
// over a unix socket in SCM_RIGHTS. The Handle takes ownership of fd, also on
// error (fd is closed then).
func FromFD(fd int) (*Handle, error) {
	f := os.NewFile(uintptr(fd), fmt.Sprintf("netns-fd-%d", fd))
	if f == nil {
		return nil, fmt.Errorf("netns: fd %d: %w", fd, ErrNotNetns)
	}
	h, err := fromFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("netns: fd %d: %w", fd, err)
	}
	return h, nil
}

// Current opens the network namespace of the calling goroutine's thread,
// which is the process's namespace unless called from inside Do.
func Current() (*Handle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return Open("/proc/thread-self/ns/net")
}

func fromFile(f *os.File) (*Handle, error) {
	fd := int(f.Fd())
	typ, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	if err != nil {
		return nil, fmt.Errorf("NS_GET_NSTYPE: %w (%w)", ErrNotNetns, err)
	}
	if typ != unix.CLONE_NEWNET {
		return nil, fmt.Errorf("namespace type %#x: %w", typ, ErrNotNetns)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	h := &Handle{f: f, fd: fd, id: ID{Dev: st.Dev, Ino: st.Ino}}
	for k := range h.pool.ready {
		h.pool.ready[k] = make(chan int, poolDepth)
	}
	return h, nil
}

// ID returns the namespace's identity. The zero ID for a nil Handle.
func (h *Handle) ID() ID {
	if h == nil {
		return ID{}
	}
	return h.id
}

// FD returns the underlying file descriptor, valid until Close (for sending it
// in SCM_RIGHTS). The Handle keeps ownership. h must not be nil.
func (h *Handle) FD() int { return h.fd }

// Close releases the fd and the sockets pooled for Dial. Calling Do or the socket helpers after Close is an
// error (ErrClosed); sockets already created stay in the namespace and stay
// usable, and a dial that already has its socket completes.
func (h *Handle) Close() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return fmt.Errorf("netns: close %s: %w", h, ErrClosed)
	}
	defer h.mu.Unlock()
	h.closed = true
	if h.pool.idle != nil {
		h.pool.idle.Stop()
	}
	h.pool.drain()
	return h.f.Close()
}

func (h *Handle) String() string {
	if h == nil {
		return "netns[current]"
	}
	return h.id.String()
}

// Do runs fn with the current OS thread in h's network namespace and returns
// fn's error. Sockets created by fn belong to h's namespace; so do children
// exec'd by fn (they inherit the thread's namespace). Goroutines started by fn
// do not run in the namespace.
//
// fn runs on a fresh goroutine locked to its thread, which Do waits for: if
// switching back fails, that goroutine exits still locked, so the Go runtime
// terminates the thread instead of reusing it in the wrong namespace (if it
// happened to be the main thread, the runtime parks it forever instead), and
// the caller's own thread is never affected. A panic in fn is re-raised in the
// caller after the thread is restored.
func (h *Handle) Do(fn func() error) error {
	if h == nil {
		return fn()
	}
	type result struct {
		err      error
		panicked bool
		panicVal any
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = h.enterAndRun(fn, &r.panicked, &r.panicVal)
		done <- r
		// If enterAndRun left the thread locked (restore failed), returning
		// here makes the runtime exit the thread.
	}()
	r := <-done
	if r.panicked {
		panic(r.panicVal)
	}
	return r.err
}

// homeFD is an fd of the process's own network namespace, opened during
// package initialisation, which runs on the main thread before any Do can
// move a thread. Every thread Do hands back to the runtime is in it: a
// thread that cannot switch back is discarded, and nothing else in the
// process calls setns. Opening /proc/thread-self/ns/net per call instead
// cost four syscalls per dial (openat, fcntl, a failed epoll registration
// and close; see BenchmarkDial).
var homeFD, homeErr = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)

func home() (int, error) { return homeFD, homeErr }

// enterAndRun is Do's body on its own goroutine. It returns with the thread
// unlocked iff the thread is back in its original namespace.
func (h *Handle) enterAndRun(fn func() error, panicked *bool, panicVal *any) (err error) {
	orig, err := home()
	if err != nil {
		return fmt.Errorf("netns: open original namespace: %w", err)
	}
	runtime.LockOSThread()
	if err := h.enter(); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer func() {
		if rerr := h.leave(orig); rerr != nil {
			// Leave the thread locked: it must never run another goroutine.
			err = errors.Join(err, rerr)
			return
		}
		runtime.UnlockOSThread()
	}()
	defer func() {
		if v := recover(); v != nil {
			*panicked, *panicVal = true, v
		}
	}()
	return fn()
}

// enter switches the calling thread, which the caller has locked, into h.
func (h *Handle) enter() error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.closed {
		return fmt.Errorf("netns: %s: %w", h, ErrClosed)
	}
	if err := unix.Setns(h.fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("netns: setns into %s: %w", h, err)
	}
	return nil
}

// leave switches the calling thread from h back to the namespace orig. On
// error (wrapping ErrRestore) the caller must keep the thread locked until
// its goroutine exits, so that the runtime discards it.
func (h *Handle) leave(orig int) error {
	back := h.restore
	if back == nil {
		back = func(fd int) error { return unix.Setns(fd, unix.CLONE_NEWNET) }
	}
	if err := back(orig); err != nil {
		return fmt.Errorf("netns: leaving %s: %w: %w", h, ErrRestore, err)
	}
	return nil
}
