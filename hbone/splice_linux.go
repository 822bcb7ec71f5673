package hbone

import (
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// pollReader reads a socket into pooled buffers without holding one while
// it waits: the buffer is taken inside the poller's callback, right before
// the read(2) that is expected to succeed, and given back on EAGAIN. That
// costs the same syscalls as net.Conn.Read (read, wait, read).
type pollReader struct {
	rc   syscall.RawConn
	fn   func(uintptr) bool // r.try, bound once
	size int
	bp   *[]byte
	n    int
	err  error
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
	return p
}

func (p *pollReader) try(fd uintptr) bool {
	bp := getBuf(p.size)
	for {
		n, err := unix.Read(int(fd), *bp)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			putBuf(bp)
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
// back), or an error (io.EOF at end of stream).
func (p *pollReader) read(size int) (*[]byte, int, error) {
	p.size = size
	if err := p.rc.Read(p.fn); err != nil {
		return nil, 0, err
	}
	bp, n, err := p.bp, p.n, p.err
	p.bp = nil
	return bp, n, err
}
