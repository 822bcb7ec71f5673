package hbone

import "sync"

// Buffers come from size-classed sync.Pools so an idle tunnel holds none:
// a stream's receive queue is empty once read, frame writes borrow a buffer
// for the duration of one write, and the splice loop borrows its read
// buffer only while bytes are flowing (see splice.go).
//
// Classes are powers of four from 1 KiB to 256 KiB. A sync.Pool is a cache,
// not state: it changes no behaviour, so keeping it package-level does not
// break the no-package-state rule.
const (
	minBufShift = 10 // 1 KiB
	numBufClass = 5  // 1, 4, 16, 64, 256 KiB
)

var bufPools [numBufClass]sync.Pool // of *[]byte

func bufClass(n int) int {
	c := 0
	for size := 1 << minBufShift; size < n; size <<= 2 {
		c++
	}
	return c
}

// getBuf returns a buffer of length n from the smallest class that fits.
// Buffers above the largest class are allocated and not pooled.
func getBuf(n int) *[]byte {
	c := bufClass(n)
	if c >= numBufClass {
		b := make([]byte, n)
		return &b
	}
	if bp, ok := bufPools[c].Get().(*[]byte); ok {
		*bp = (*bp)[:n]
		return bp
	}
	b := make([]byte, n, 1<<(minBufShift+2*c))
	return &b
}

// putBuf returns a buffer from getBuf to its pool.
func putBuf(bp *[]byte) {
	c := cap(*bp)
	for i := range numBufClass {
		if c == 1<<(minBufShift+2*i) {
			bufPools[i].Put(bp)
			return
		}
	}
}

// chunkQueue is a stream's received-but-unread bytes: a FIFO of pooled
// chunks. The zero value is empty and holds no memory. Guarded by the
// connection's mutex.
type chunkQueue struct {
	chunks []queuedChunk
	head   int
	n      int // bytes queued
}

type queuedChunk struct {
	buf *[]byte // len = bytes written; cap = class size
	off int     // read offset
}

// push copies p into the queue, filling the tail chunk before taking new
// ones, so many tiny frames cannot pin one chunk each.
func (q *chunkQueue) push(p []byte) {
	q.n += len(p)
	if len(q.chunks) > q.head {
		t := &q.chunks[len(q.chunks)-1]
		b := *t.buf
		if k := copy(b[len(b):cap(b)], p); k > 0 {
			*t.buf = b[:len(b)+k]
			p = p[k:]
		}
	}
	for len(p) > 0 {
		size := len(p)
		if size > maxChunk {
			size = maxChunk
		}
		bp := getBuf(size)
		b := (*bp)[:cap(*bp)]
		k := copy(b, p)
		*bp = b[:k]
		p = p[k:]
		q.chunks = append(q.chunks, queuedChunk{buf: bp})
	}
}

// pushChunk appends a filled pooled buffer; the queue owns it from now on.
func (q *chunkQueue) pushChunk(bp *[]byte) {
	q.n += len(*bp)
	q.chunks = append(q.chunks, queuedChunk{buf: bp})
}

// pushChunkFrom appends a filled pooled buffer of which the first off bytes
// were consumed already; the queue owns it from now on.
func (q *chunkQueue) pushChunkFrom(bp *[]byte, off int) {
	q.n += len(*bp) - off
	q.chunks = append(q.chunks, queuedChunk{buf: bp, off: off})
}

// maxChunk is the largest receive chunk.
const maxChunk = 16 << 10

// read copies queued bytes into p.
func (q *chunkQueue) read(p []byte) int {
	n := 0
	for n < len(p) && q.head < len(q.chunks) {
		c := &q.chunks[q.head]
		k := copy(p[n:], (*c.buf)[c.off:])
		c.off += k
		n += k
		if c.off == len(*c.buf) {
			q.popHead()
		}
	}
	q.n -= n
	return n
}

// pop removes and returns the head chunk's unread bytes; the caller owns bp
// and must putBuf it.
func (q *chunkQueue) pop() (bp *[]byte, data []byte) {
	c := q.chunks[q.head]
	q.chunks[q.head] = queuedChunk{}
	q.head++
	if q.head == len(q.chunks) {
		q.chunks, q.head = q.chunks[:0], 0
	}
	data = (*c.buf)[c.off:]
	q.n -= len(data)
	return c.buf, data
}

func (q *chunkQueue) popHead() {
	putBuf(q.chunks[q.head].buf)
	q.chunks[q.head] = queuedChunk{}
	q.head++
	if q.head == len(q.chunks) {
		q.chunks, q.head = q.chunks[:0], 0
	}
}

// reset drops everything queued and returns how many bytes were dropped.
func (q *chunkQueue) reset() int {
	n := q.n
	for q.head < len(q.chunks) {
		q.popHead()
	}
	q.chunks, q.n = nil, 0
	return n
}
