package hbone

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pollReader reads a socket into pooled buffers without holding one while
// it waits: the buffer is taken inside the poller's callback, right before
// the read(2) that is expected to succeed, and given back on EAGAIN. That
// costs the same syscalls as net.Conn.Read (read, wait, read).
type pollReader struct {
	rc     syscall.RawConn
	fn     func(uintptr) bool // r.try, bound once
	ctlFn  func(uintptr)      // r.try for RawConn.Control, bound once
	nowait bool               // answer errWouldBlock instead of waiting (sockWatch)
	size   int
	bp     *[]byte
	n      int
	err    error
}

func newPollReader(c any) *pollReader {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	p := &pollReader{rc: rc}
	p.fn = p.try
	p.ctlFn = func(fd uintptr) { p.try(fd) }
	return p
}

func (p *pollReader) try(fd uintptr) bool {
	bp := getBuf(p.size)
	for {
		n, err := rawRead(int(fd), *bp)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			putBuf(bp)
			if p.nowait {
				p.bp, p.n, p.err = nil, 0, errWouldBlock
				return true
			}
			return false // the poller waits for readability and calls again
		}
		switch {
		case err != nil:
			putBuf(bp)
			p.bp, p.n, p.err = nil, 0, os.NewSyscallError("read", err)
		case n == 0:
			putBuf(bp)
			p.bp, p.n, p.err = nil, 0, io.EOF
		default:
			p.bp, p.n, p.err = bp, n, nil
		}
		return true
	}
}

// read returns a pooled buffer holding n > 0 bytes (the caller puts it
// back), or an error (io.EOF at end of stream; errWouldBlock with nowait
// when nothing is there yet).
func (p *pollReader) read(size int) (*[]byte, int, error) {
	p.size = size
	var err error
	if p.nowait {
		// Control, not Read: a read that never waits needs neither the
		// poller's readiness nor its deadline (sockWatch.linger leaves one
		// set while a socket is busy).
		err = p.rc.Control(p.ctlFn)
	} else {
		err = p.rc.Read(p.fn)
	}
	if err != nil {
		return nil, 0, err
	}
	bp, n, err := p.bp, p.n, p.err
	p.bp = nil
	return bp, n, err
}

// sinkWriter writes received tunnel bytes straight to a spliced socket
// from the read loop, without blocking: one write(2) attempt per call
// (repeated only while it makes progress). What the socket does not take
// at once goes to the queue and the drain goroutine (see readChunk).
type sinkWriter struct {
	rc syscall.RawConn
	fn func(uintptr) bool // w.try, bound once
	p  []byte
	n  int

	// The drain goroutine's writev; its own fields, so that it never
	// shares state with the read loop's write.
	vfn  func(uintptr) bool // w.tryv, bound once
	vbuf [][]byte
	iov  [drainBatch]unix.Iovec
	vn   int64
	verr error
}

// newSinkWriter returns a writer for a TCP sink; nil for anything else
// (a Tunnel, a TLS connection, a test pipe), which keeps the drain path.
func newSinkWriter(c any) *sinkWriter {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &sinkWriter{rc: rc}
	w.fn, w.vfn = w.try, w.tryv
	return w
}

// writev writes all of bufs for the drain goroutine, waiting in the poller
// while the socket is full: writev(2) without the runtime's syscall
// bookkeeping, as rawWrite. Under bulk transfer a write of 64 KiB or more
// to a local socket runs the receiver's input path inside the call, long
// enough for sysmon to take the P from a thread in a bookkept syscall and
// start another: a futex wake and a context switch per write (bench/mesh,
// one stream: 1,203 futex calls and 9,244 context switches in 2 s on the
// receiving proxy with one P).
func (w *sinkWriter) writev(bufs [][]byte) (int64, error) {
	w.vbuf, w.vn, w.verr = bufs, 0, nil
	err := w.rc.Write(w.vfn)
	n := w.vn
	if err == nil {
		err = w.verr
	}
	w.vbuf, w.verr = nil, nil
	w.iov = [drainBatch]unix.Iovec{} // hold no pooled buffer
	return n, err
}

func (w *sinkWriter) tryv(fd uintptr) bool {
	for {
		k := 0
		for _, b := range w.vbuf {
			if k == len(w.iov) {
				break
			}
			if len(b) > 0 {
				w.iov[k].Base = &b[0]
				w.iov[k].SetLen(len(b))
				k++
			}
		}
		if k == 0 {
			return true // nothing but empty buffers left
		}
		n, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&w.iov[0])), uintptr(k))
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return false // wait until the socket has room
		case e != 0:
			w.verr = os.NewSyscallError("writev", e)
			return true
		}
		w.vn += int64(n)
		for m := int(n); m > 0; {
			if b := w.vbuf[0]; m >= len(b) {
				m -= len(b)
				w.vbuf = w.vbuf[1:]
			} else {
				w.vbuf[0] = b[m:]
				m = 0
			}
		}
	}
}

func (w *sinkWriter) try(fd uintptr) bool {
	for w.n < len(w.p) {
		k, err := rawWrite(int(fd), w.p[w.n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || k <= 0 {
			break // EAGAIN (full) or an error the drain goroutine will meet
		}
		w.n += k
	}
	return true // never wait for writability: the read loop must not block
}

// write writes as much of p as the socket takes now and returns how much.
func (w *sinkWriter) write(p []byte) int {
	w.p, w.n = p, 0
	if err := w.rc.Write(w.fn); err != nil {
		w.n = 0
	}
	n := w.n
	w.p = nil
	return n
}

// rawRead and rawWrite are read(2) and write(2) on a non-blocking socket
// without the runtime's syscall bookkeeping (unix.Read would call
// entersyscall, whose first call after the process was idle wakes the
// sysmon thread: one futex wake and context switch per request at low
// load). They never block: the socket is non-blocking and EAGAIN is
// answered by waiting in the poller, so the bookkeeping buys nothing.
func rawRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func rawWrite(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// fdWriter writes all of p to a socket with rawWrite, waiting in the poller
// while the socket is full; the write deadline applies as to Write.
type fdWriter struct {
	rc  syscall.RawConn
	fn  func(uintptr) bool // w.try, bound once
	mu  sync.Mutex         // one write at a time (TLS serialises them already)
	p   []byte
	n   int
	err error
}

func newFdWriter(c any) *fdWriter {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &fdWriter{rc: rc}
	w.fn = w.try
	return w
}

func (w *fdWriter) try(fd uintptr) bool {
	for w.n < len(w.p) {
		k, err := rawWrite(int(fd), w.p[w.n:])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false // wait until the socket has room
		case err != nil:
			w.err = os.NewSyscallError("write", err)
			return true
		}
		w.n += k
	}
	return true
}

func (w *fdWriter) write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.p, w.n, w.err = p, 0, nil
	err := w.rc.Write(w.fn)
	n := w.n
	if err == nil {
		err = w.err
	}
	w.p, w.err = nil, nil
	return n, err
}
