package hbone

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// Tunnel is one HBONE CONNECT stream: a net.Conn whose bytes travel as
// HTTP/2 DATA frames. CloseWrite half-closes (END_STREAM) and the peer's
// half-close reads as io.EOF, so half-close passes through both ways.
// BytesSent and BytesReceived count payload bytes and may be read at any
// time, also after Close.
//
// An idle Tunnel holds no buffers and no goroutines: received bytes wait in
// pooled chunks that are returned as they are read.
type Tunnel struct {
	c  *conn
	id uint32

	sendWin     int64      // under c.mu
	recvWin     int64      // under c.mu
	recvUnacked int64      // under c.mu
	q           chunkQueue // under c.mu
	localEnd    bool       // under c.mu; END_STREAM sent
	remoteEnd   bool       // under c.mu; END_STREAM received
	err         error      // under c.mu; reset or connection failure
	closed      bool       // under c.mu; Close was called
	counted     bool       // under c.mu; holds a client slot on c
	status      int        // under c.mu; client: response status, 0 until it arrives
	respBaggage string     // under c.mu
	cancel      func()     // under c.mu; server: cancels the handler's context

	// Splice state: the t→sink direction runs on a goroutine started only
	// when there is something to deliver (see kickDrain), so an idle
	// spliced tunnel parks no goroutine for it.
	spliced  atomic.Bool
	sink     net.Conn    // under c.mu
	through  *sinkWriter // under c.mu; non-nil: small frames go to sink from the read loop
	draining bool        // under c.mu; a drain goroutine runs
	splice   *splice     // under c.mu; told when t→sink has ended; nil after
	drainErr error       // under c.mu

	rnotify chan struct{} // cap 1: data, EOF, response or error arrived
	wnotify chan struct{} // cap 1: send window grew or error
	rdl     deadline
	wdl     deadline

	sent, recvd atomic.Int64
}

// TunnelStats are a tunnel's byte counts from this side's point of view.
type TunnelStats struct {
	BytesSent     int64 // payload bytes written into the tunnel
	BytesReceived int64 // payload bytes read out of the tunnel
}

// Stats returns the byte counts so far.
func (t *Tunnel) Stats() TunnelStats {
	return TunnelStats{BytesSent: t.sent.Load(), BytesReceived: t.recvd.Load()}
}

// BytesSent is the number of payload bytes written so far.
func (t *Tunnel) BytesSent() int64 { return t.sent.Load() }

// BytesReceived is the number of payload bytes read so far.
func (t *Tunnel) BytesReceived() int64 { return t.recvd.Load() }

// PeerIdentity is the verified identity of the other end of the HBONE
// connection: the server's on a client tunnel, the client's on a server one.
func (t *Tunnel) PeerIdentity() identity.Identity { return t.c.peer }

// ResponseBaggage is the baggage header of the server's 200 answer, if any
// (Istio 1.29+ describes the destination workload there).
func (t *Tunnel) ResponseBaggage() string {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return t.respBaggage
}

// LocalAddr is the local address of the underlying HBONE connection.
func (t *Tunnel) LocalAddr() net.Addr { return t.c.nc.LocalAddr() }

// RemoteAddr is the remote address of the underlying HBONE connection.
func (t *Tunnel) RemoteAddr() net.Addr { return t.c.nc.RemoteAddr() }

// Read reads tunnel bytes; it returns io.EOF after the peer's half-close.
func (t *Tunnel) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c := t.c
	c.mu.Lock()
	for {
		if t.closed {
			c.mu.Unlock()
			return 0, net.ErrClosed
		}
		if t.q.n > 0 {
			n := t.q.read(p)
			sInc, cInc := t.consumedLocked(int64(n))
			c.mu.Unlock()
			t.recvd.Add(int64(n))
			c.writeWindowUpdates(t.id, sInc, cInc)
			return n, nil
		}
		if t.remoteEnd {
			c.mu.Unlock()
			return 0, io.EOF
		}
		if t.err != nil {
			err := t.err
			c.mu.Unlock()
			return 0, err
		}
		c.mu.Unlock()
		select {
		case <-t.rnotify:
		case <-t.rdl.wait():
			return 0, os.ErrDeadlineExceeded
		}
		c.mu.Lock()
	}
}

// consumedLocked returns n read bytes to the flow-control windows and says
// how much WINDOW_UPDATE to send for the stream and the connection.
func (t *Tunnel) consumedLocked(n int64) (streamInc, connInc int64) {
	c := t.c
	t.recvUnacked += n
	c.recvUnacked += n
	if !t.remoteEnd && t.err == nil && t.recvUnacked >= int64(c.cfg.StreamWindow)/4 {
		streamInc = t.recvUnacked
		t.recvWin += streamInc
		t.recvUnacked = 0
	}
	return streamInc, c.takeConnCreditLocked()
}

// Write writes p as DATA frames, blocking on HTTP/2 flow control.
func (t *Tunnel) Write(p []byte) (int, error) { return t.write(p, nil) }

// write is Write; bl, if not nil, is told before and after each wait for
// flow control (a splice worker stops counting as running meanwhile).
func (t *Tunnel) write(p []byte, bl blocker) (int, error) {
	n := 0
	for len(p) > 0 {
		k, err := t.reserveSend(len(p), bl)
		if err != nil {
			return n, err
		}
		if err := t.writeData(p[:k], false); err != nil {
			return n, err
		}
		t.sent.Add(int64(k))
		n += k
		p = p[k:]
	}
	return n, nil
}

func (t *Tunnel) writeErrLocked() error {
	switch {
	case t.closed:
		return net.ErrClosed
	case t.err != nil:
		return t.err
	case t.localEnd:
		return errWriteAfterCloseWrite
	}
	return nil
}

// blocker is told when a write starts and stops waiting for flow control.
type blocker interface {
	block()
	unblock()
}

var errWriteAfterCloseWrite = errors.New("hbone: write after CloseWrite")

// reserveSend waits until the stream and connection windows allow at least
// one byte and takes up to want bytes (one frame's worth) from both.
func (t *Tunnel) reserveSend(want int, bl blocker) (int, error) {
	c := t.c
	c.mu.Lock()
	for {
		if err := t.writeErrLocked(); err != nil {
			c.mu.Unlock()
			return 0, err
		}
		if avail := min(t.sendWin, c.sendWin); avail > 0 {
			k := min(int64(want), avail, int64(c.peerMaxFrame), maxDataPayload)
			t.sendWin -= k
			c.sendWin -= k
			c.mu.Unlock()
			return int(k), nil
		}
		connCh := c.sendWinCh
		c.mu.Unlock()
		if bl != nil {
			bl.block()
		}
		select {
		case <-t.wnotify:
		case <-connCh:
		case <-t.wdl.wait():
			if bl != nil {
				bl.unblock()
			}
			return 0, os.ErrDeadlineExceeded
		}
		if bl != nil {
			bl.unblock()
		}
		c.mu.Lock()
	}
}

func (t *Tunnel) writeData(p []byte, end bool) error {
	c := t.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if err := t.writeErrLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	var flags uint8
	if end {
		flags = flagEndStream
		t.localEnd = true
	}
	c.mu.Unlock()
	return c.writeFrameLocked(frameData, flags, t.id, p)
}

// CloseWrite half-closes the tunnel: the peer reads EOF after the bytes
// written so far, and this side can keep reading.
func (t *Tunnel) CloseWrite() error {
	c := t.c
	c.mu.Lock()
	done := t.localEnd && t.err == nil && !t.closed
	c.mu.Unlock()
	if done {
		return nil
	}
	if err := t.writeData(nil, true); err != nil {
		return err
	}
	c.mu.Lock()
	gone := c.maybeRemoveLocked(t)
	c.mu.Unlock()
	c.afterRemove(gone)
	return nil
}

// Close ends the tunnel. If both sides already half-closed (or the peer did
// and nothing is pending) it ends cleanly; otherwise the stream is reset
// with CANCEL, like a TCP close with unread data.
func (t *Tunnel) Close() error {
	c := t.c
	c.mu.Lock()
	if t.closed {
		c.mu.Unlock()
		return nil
	}
	finished := t.err != nil || (t.localEnd && t.remoteEnd)
	clean := !finished && t.remoteEnd && !t.localEnd
	c.mu.Unlock()
	switch {
	case finished:
	case clean:
		if t.writeData(nil, true) == nil {
			break
		}
		fallthrough
	default:
		t.resetWith(http2.ErrCodeCancel, true)
	}
	c.mu.Lock()
	t.closed = true
	dropped := t.q.reset()
	gone := c.removeLocked(t)
	c.mu.Unlock()
	t.wakeRead()
	t.wakeWrite()
	c.creditConn(int64(dropped))
	c.afterRemove(gone)
	return nil
}

// resetWith resets the stream with code (RST_STREAM) unless it has already
// ended. local says whether to record the error as ours.
func (t *Tunnel) resetWith(code http2.ErrCode, local bool) {
	c := t.c
	c.mu.Lock()
	if t.err != nil || (t.localEnd && t.remoteEnd) {
		c.mu.Unlock()
		return
	}
	t.err = &StreamResetError{Code: code}
	gone := c.removeLocked(t)
	cancel := t.cancel
	c.mu.Unlock()
	_ = local
	if cancel != nil {
		cancel()
	}
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], uint32(code))
	c.writeFrame(frameRSTStream, 0, t.id, p[:])
	t.wakeRead()
	t.wakeWrite()
	c.afterRemove(gone)
}

func (t *Tunnel) wakeRead() {
	if t.spliced.Load() {
		t.kickDrain()
		return
	}
	select {
	case t.rnotify <- struct{}{}:
	default:
	}
}

func (t *Tunnel) wakeWrite() {
	select {
	case t.wnotify <- struct{}{}:
	default:
	}
}

// SetDeadline sets the read and write deadlines.
func (t *Tunnel) SetDeadline(d time.Time) error {
	_ = t.SetReadDeadline(d)
	return t.SetWriteDeadline(d)
}

// SetReadDeadline sets the read deadline, for a Read already blocked too
// (as net.Conn requires): it is woken to wait on the new deadline.
func (t *Tunnel) SetReadDeadline(d time.Time) error {
	t.rdl.set(d)
	select {
	case t.rnotify <- struct{}{}:
	default:
	}
	return nil
}

// SetWriteDeadline sets the write deadline, for a Write already blocked on
// flow control too.
func (t *Tunnel) SetWriteDeadline(d time.Time) error {
	t.wdl.set(d)
	t.wakeWrite()
	return nil
}

// waitReadable blocks until bytes, EOF or an error can be read, without
// holding a buffer (the splice loop reads only then).
func (t *Tunnel) waitReadable(ctx context.Context) error {
	c := t.c
	for {
		c.mu.Lock()
		ready := t.q.n > 0 || t.remoteEnd || t.err != nil || t.closed
		c.mu.Unlock()
		if ready {
			return nil
		}
		select {
		case <-t.rnotify:
		case <-t.rdl.wait():
			return os.ErrDeadlineExceeded
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// kickDrain starts the drain goroutine of a spliced tunnel if there is
// something to deliver (bytes, EOF or an error) and none runs. The check
// and the flag change share c.mu with the producers, so no wake-up is lost.
func (t *Tunnel) kickDrain() {
	c := t.c
	c.mu.Lock()
	if t.draining || t.splice == nil || (t.q.n == 0 && !t.remoteEnd && t.err == nil && !t.closed) {
		c.mu.Unlock()
		return
	}
	t.draining = true
	// Only an end to pass on (no bytes, and none can come after it): no
	// write that waits on the sink, so a splice worker may take it. When
	// a connection's streams end together (its peer closed them, a wave of
	// tunnels closing), a goroutine each would be a burst of them.
	ending := t.q.n == 0
	c.mu.Unlock()
	if ending && runEnding(t) {
		return
	}
	go t.drain()
}

// drainBatch is how many queued chunks one drain write takes.
const drainBatch = 16

// drain moves received bytes to the sink, several chunks per writev and
// without copying them again, until the queue is empty (the goroutine
// exits) or the direction ends: EOF half-closes the sink, an error aborts
// both. Flow-control credit is returned only after the sink took the bytes,
// so a slow sink slows the peer.
func (t *Tunnel) drain() {
	const maxBatch = drainBatch
	var bps [maxBatch]*[]byte
	var bufs [maxBatch][]byte
	c := t.c
	for {
		c.mu.Lock()
		if t.q.n > 0 && !t.closed {
			k := 0
			var n int64
			for ; k < maxBatch && t.q.n > 0; k++ {
				bps[k], bufs[k] = t.q.pop()
				n += int64(len(bufs[k]))
			}
			sink, through := t.sink, t.through
			c.mu.Unlock()
			var err error
			if through != nil {
				_, err = through.writev(bufs[:k])
			} else {
				nb := net.Buffers(bufs[:k])
				_, err = nb.WriteTo(sink)
			}
			for i := range k {
				putBuf(bps[i])
				bps[i], bufs[i] = nil, nil
			}
			c.mu.Lock()
			sInc, cInc := t.consumedLocked(n)
			c.mu.Unlock()
			t.recvd.Add(n)
			c.writeWindowUpdates(t.id, sInc, cInc)
			if err != nil {
				t.finishDrain(err)
				return
			}
			continue
		}
		var err error
		switch {
		case t.closed:
			err = net.ErrClosed
		case t.remoteEnd:
			err = io.EOF
		case t.err != nil:
			err = t.err
		default:
			t.draining = false // idle: exit; the next event starts a new drain
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if err == io.EOF {
			err = nil
		}
		t.finishDrain(err)
		return
	}
}

// finishDrain ends the t→sink direction: half-close the sink on EOF, abort
// both on an error, then tell the splice.
func (t *Tunnel) finishDrain(err error) {
	c := t.c
	c.mu.Lock()
	sp, sink := t.splice, t.sink
	t.splice, t.drainErr, t.draining = nil, err, false
	c.mu.Unlock()
	if err == nil {
		if cw, ok := sink.(interface{ CloseWrite() error }); ok {
			err = cw.CloseWrite()
			c.mu.Lock()
			t.drainErr = err
			c.mu.Unlock()
		}
	}
	if err != nil {
		t.resetWith(http2.ErrCodeCancel, true)
		sp.abortIn() // closes sink
	}
	sp.endOut()
}

// deadline is a settable point in time with a channel that is closed when
// it passes. The zero value has no deadline and allocates nothing.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{} // nil until a deadline is set
}

func (d *deadline) set(at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		d.ch = nil // the old timer fired and closed ch: start afresh
	}
	d.timer = nil
	if at.IsZero() {
		if d.ch != nil {
			select {
			case <-d.ch:
				d.ch = nil
			default:
			}
		}
		return
	}
	if d.ch == nil {
		d.ch = make(chan struct{})
	} else {
		select {
		case <-d.ch:
			d.ch = make(chan struct{})
		default:
		}
	}
	if dur := time.Until(at); dur <= 0 {
		close(d.ch)
		return
	}
	ch := d.ch
	d.timer = time.AfterFunc(time.Until(at), func() { close(ch) })
}

// wait returns a channel closed when the deadline passes; nil (never
// ready) when no deadline is set.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}
