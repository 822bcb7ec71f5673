package wire

import (
	"bufio"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/net/http/httpguts"
)

// The fast path reads most heads itself instead of with http.ReadRequest
// and http.ReadResponse: those two were a fifth of the waypoint's CPU at
// 1k req/s (bench/waypoint), half of it allocations (a string per header
// line, net/textproto's reader, the body's). It reads only heads in a plain
// subset, where net/http's reading is simple to match exactly; any other
// head (and every refusal) is still net/http's to read and decide. The
// differential fuzz targets in h1 and upstream hold the two to the same
// result on the same bytes.

// plainValue reports whether every byte of v is visible ASCII, a space or
// a tab: a value net/textproto takes as it is, after trimming.
func plainValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' || c > '~') && c != '\t' {
			return false
		}
	}
	return true
}

// PlainText reports whether s is visible ASCII and spaces only (a request
// target, a reason phrase).
func PlainText(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' {
			return false
		}
	}
	return true
}

// ParseFields reads a head's field lines: s runs from just after the start
// line's CRLF through the blank line's CRLF. The header is the one
// net/textproto's reader makes of the same lines (canonical names, values
// trimmed of spaces and tabs, repeated fields in order), with names and
// values sharing s's memory. ok is false for lines outside the plain
// subset: a line not ended by CRLF, a name that is not a token, a value
// byte that is not visible ASCII, a space or a tab. The caller then reads
// the head with net/http, which decides what those mean. room is how many
// fields the caller will add: the map is made big enough for them too, as
// growing it later costs a new table and a copy.
func ParseFields(s string, room int) (h http.Header, ok bool) {
	if !strings.HasSuffix(s, "\r\n") {
		return nil, false
	}
	n := strings.Count(s, "\n") - 1 // the blank line ends it
	if n < 0 {
		return nil, false
	}
	h = make(http.Header, n+room)
	// One backing array for the values, as net/textproto: a field's first
	// value is a one-element slice of it.
	strs := make([]string, n)
	for {
		eol := strings.Index(s, "\r\n")
		if eol < 0 {
			return nil, false
		}
		line := s[:eol]
		s = s[eol+2:]
		if line == "" {
			if s != "" {
				return nil, false // bytes after the blank line: not a head
			}
			return h, true
		}
		colon := strings.IndexByte(line, ':')
		if colon <= 0 {
			return nil, false
		}
		name, v := line[:colon], line[colon+1:]
		if !httpguts.ValidHeaderFieldName(name) || !plainValue(v) {
			return nil, false
		}
		key := textproto.CanonicalMIMEHeaderKey(name)
		v = strings.Trim(v, " \t")
		if vv, seen := h[key]; seen || len(strs) == 0 {
			h[key] = append(vv, v)
			continue
		}
		vv := strs[:1:1]
		strs = strs[1:]
		vv[0] = v
		h[key] = vv
	}
}

// ContentLength is a head's declared body length as net/http reads it:
// every Content-Length value the same non-negative decimal, which stays
// as the field's one value; -1 when there is none. ok is false when the
// values differ or one is not such a number (net/http refuses those).
func ContentLength(h http.Header) (n int64, ok bool) {
	cl := h["Content-Length"]
	if len(cl) == 0 {
		return -1, true
	}
	for _, v := range cl[1:] {
		if v != cl[0] {
			return 0, false
		}
	}
	u, err := strconv.ParseUint(cl[0], 10, 63)
	if err != nil {
		return 0, false
	}
	if len(cl) > 1 {
		h["Content-Length"] = []string{cl[0]}
	}
	return int64(u), true
}

// NewBody is a body of n bytes (n > 0) read from src, as net/http's
// reader gives one for a Content-Length: the read that takes the last byte
// also returns io.EOF, an end of src before n bytes is
// io.ErrUnexpectedEOF, a Read after Close is http.ErrBodyReadAfterClose,
// and Close reads what is left so that the next message can be read,
// unless closing (the connection closes after this message).
func NewBody(src *bufio.Reader, n int64, closing bool) io.ReadCloser {
	return &body{src: io.LimitedReader{R: src, N: n}, closing: closing}
}

type body struct {
	mu      sync.Mutex
	src     io.LimitedReader
	closing bool
	sawEOF  bool
	closed  bool
}

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.readLocked(p)
}

func (b *body) readLocked(p []byte) (int, error) {
	if b.sawEOF {
		return 0, io.EOF
	}
	n, err := b.src.Read(p)
	if err == io.EOF {
		b.sawEOF = true
		if b.src.N > 0 {
			err = io.ErrUnexpectedEOF
		}
	}
	if err == nil && n > 0 && b.src.N == 0 {
		err = io.EOF
		b.sawEOF = true
	}
	return n, err
}

func (b *body) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	var err error
	if !b.sawEOF && !b.closing {
		buf := Bufs.Get()
		for err == nil {
			_, err = b.readLocked(buf)
		}
		Bufs.Put(buf)
		if err == io.EOF {
			err = nil
		}
	}
	b.closed = true
	return err
}
