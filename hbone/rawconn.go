package hbone

import (
	"net"
	"sync"
	"sync/atomic"
)

// rawConn sits between crypto/tls and the TCP socket and cuts syscalls
// without pinning memory on idle connections:
//
//   - Writes: crypto/tls writes every 16 KiB record with its own write
//     call. While a frame is being written (batch), records are gathered in
//     a pooled buffer and sent with one write; the buffer goes back to the
//     pool right after.
//   - Reads: crypto/tls reads a record at a time. rawConn reads up to
//     64 KiB at once into a pooled buffer taken only when the socket is
//     readable (pollReader) and returned as soon as TLS drained it.
//
// Reads come only from the TLS reader (the read loop, or the handshake);
// writes are serialised by crypto/tls.
type rawConn struct {
	net.Conn
	pr *pollReader // nil: plain blocking reads (not a socket)
	fw *fdWriter   // nil: writes through Conn.Write (not a socket)

	batching atomic.Bool
	wmu      sync.Mutex // guards wbuf (tls may write an alert from Close)
	wbuf     *[]byte

	rbuf       *[]byte
	rpos, rend int
}

const (
	readBatch  = 64 << 10
	writeBatch = 64<<10 + 4<<10 // a 64 KiB frame is four records plus overhead
)

var writeBatchPool = sync.Pool{New: func() any { b := make([]byte, 0, writeBatch); return &b }}

func newRawConn(c net.Conn) *rawConn {
	return &rawConn{Conn: c, pr: newPollReader(c), fw: newFdWriter(c)}
}

// write writes b to the socket.
func (r *rawConn) write(b []byte) (int, error) {
	if r.fw != nil {
		return r.fw.write(b)
	}
	return r.Conn.Write(b)
}

func (r *rawConn) Read(p []byte) (int, error) {
	if r.rbuf != nil {
		n := copy(p, (*r.rbuf)[r.rpos:r.rend])
		r.rpos += n
		if r.rpos == r.rend {
			putBuf(r.rbuf)
			r.rbuf = nil
		}
		return n, nil
	}
	if len(p) >= readBatch {
		return r.Conn.Read(p)
	}
	var bp *[]byte
	var n int
	var err error
	if r.pr != nil {
		if bp, n, err = r.pr.read(readBatch); err != nil {
			return 0, err
		}
	} else {
		bp = getBuf(readBatch)
		n, err = r.Conn.Read(*bp)
	}
	k := copy(p, (*bp)[:n])
	if k < n {
		r.rbuf, r.rpos, r.rend = bp, k, n
	} else {
		putBuf(bp)
	}
	return k, err
}

// startBatch gathers writes until flush.
func (r *rawConn) startBatch() { r.batching.Store(true) }

func (r *rawConn) Write(p []byte) (int, error) {
	if !r.batching.Load() {
		return r.write(p)
	}
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if r.wbuf == nil {
		r.wbuf = writeBatchPool.Get().(*[]byte)
	}
	b := *r.wbuf
	if len(b)+len(p) > cap(b) {
		if len(b) > 0 {
			if _, err := r.write(b); err != nil {
				*r.wbuf = b[:0]
				return 0, err
			}
			b = b[:0]
		}
		if len(p) > cap(b) {
			*r.wbuf = b
			return r.write(p)
		}
	}
	*r.wbuf = append(b, p...)
	return len(p), nil
}

// flush sends what the batch gathered and ends it.
func (r *rawConn) flush() error {
	r.batching.Store(false)
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if r.wbuf == nil {
		return nil
	}
	b := *r.wbuf
	var err error
	if len(b) > 0 {
		_, err = r.write(b)
	}
	*r.wbuf = b[:0]
	writeBatchPool.Put(r.wbuf)
	r.wbuf = nil
	return err
}
