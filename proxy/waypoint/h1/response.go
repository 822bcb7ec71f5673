package h1

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/wire"
)

// Responses of the fast path: an upstream response sent on, and the
// waypoint's own answers (refusals, faults, upstream failures).

// WriteResponse sends resp downstream: its status line and header without
// the hop-by-hop fields, framed by its length or chunked (a chunked or
// close-delimited upstream body goes chunked, its trailers after it), the
// head and the first body bytes in one write. It returns the bytes written
// and whether the upstream connection can serve another request.
func (c *Conn) WriteResponse(r *http.Request, resp *http.Response, keep bool) (int64, bool, error) {
	var bodyN int64
	defer func() { c.bodySent = bodyN }()
	buf := wire.Bufs.Get()
	defer wire.Bufs.Put(buf)
	h := resp.Header
	wire.RemoveHopByHop(h, false)
	noBody := r.Method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified
	if !noBody {
		delete(h, "Content-Length")
	}
	chunked := !noBody && (resp.ContentLength < 0 || len(resp.Trailer) > 0)
	b := appendStatusLine(buf[:0], resp.StatusCode, resp.Status)
	b = wire.AppendHeaders(b, h)
	b = appendDate(b, h)
	switch {
	case chunked:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
		if len(resp.Trailer) > 0 {
			b = append(b, "Trailer: "...)
			first := true
			for k := range resp.Trailer {
				if !first {
					b = append(b, ", "...)
				}
				first = false
				b = append(b, k...)
			}
			b = append(b, "\r\n"...)
		}
	case !noBody:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, resp.ContentLength, 10)
		b = append(b, "\r\n"...)
	}
	if !keep {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	var written int64
	if len(b) > len(buf)/2 {
		// A huge head: on its own, the buffer is for the body.
		n, err := c.tc.Write(b)
		written += int64(n)
		if err != nil {
			return written, false, err
		}
		b = buf[:0]
	}
	write := func(p []byte) error {
		n, err := c.tc.Write(p)
		written += int64(n)
		return err
	}
	if noBody {
		err := write(b)
		return written, err == nil && !resp.Close, err
	}
	pre := len(b)
	for first := true; ; first = false {
		var n int
		var rerr error
		if chunked {
			n, rerr = resp.Body.Read(buf[pre+wire.ChunkReserve : len(buf)-2])
		} else {
			want := int64(len(buf) - pre)
			left := resp.ContentLength - bodyN
			if left <= want && first {
				// It fits: all of it with the head, one write.
				n, rerr = io.ReadFull(resp.Body, buf[pre:pre+int(left)])
			} else {
				// On as it comes, as ReverseProxy copies.
				n, rerr = resp.Body.Read(buf[pre : pre+int(min(want, left))])
			}
			if rerr == io.EOF && bodyN+int64(n) < resp.ContentLength {
				rerr = io.ErrUnexpectedEOF // short of its Content-Length
			} else if rerr == io.EOF {
				rerr = nil
			}
		}
		bodyN += int64(n)
		var out []byte
		switch {
		case chunked && n > 0:
			out = wire.FrameChunk(buf, pre, n)
		case chunked:
			out = buf[:pre]
		default:
			out = buf[:pre+n]
		}
		eof := chunked && rerr == io.EOF || !chunked && rerr == nil && bodyN == resp.ContentLength
		if eof && chunked {
			// The last chunk (and trailers) with the data before it.
			if len(out) > 0 && &out[0] != &buf[0] {
				copy(buf, out)
			}
			out = wire.AppendLastChunk(buf[:len(out)], resp.Trailer)
		}
		if len(out) > 0 || first {
			if err := write(out); err != nil {
				return written, false, err
			}
		}
		pre = 0
		if eof {
			// A close-delimited body ends its connection (resp.Close).
			return written, !resp.Close && (rerr == io.EOF || wire.IsEOF(resp.Body)), nil
		}
		if rerr != nil {
			return written, false, rerr
		}
	}
}

// appendStatusLine writes "HTTP/1.1 code reason"; the reason is net/http's
// text for the code, else the upstream's.
func appendStatusLine(b []byte, code int, status string) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	if t := http.StatusText(code); t != "" {
		b = append(b, t...)
	} else if len(status) > 4 {
		b = append(b, status[4:]...)
	}
	return append(b, "\r\n"...)
}

// appendDate adds the Date field where the header has none, as net/http's
// server does.
func appendDate(b []byte, h http.Header) []byte {
	if _, ok := h["Date"]; ok {
		return b
	}
	b = append(b, "Date: "...)
	b = time.Now().UTC().AppendFormat(b, http.TimeFormat)
	return append(b, "\r\n"...)
}

// LocalResponse is an answer of the waypoint's own, built by the same code
// the net/http path uses (an http.ResponseWriter) and written whole by
// WriteLocal.
type LocalResponse struct {
	h    http.Header
	code int
	body bytes.Buffer
}

// NewLocalResponse returns an empty answer.
func NewLocalResponse() *LocalResponse { return &LocalResponse{h: http.Header{}} }

func (l *LocalResponse) Header() http.Header { return l.h }

func (l *LocalResponse) WriteHeader(code int) {
	if l.code == 0 {
		l.code = code
	}
}

func (l *LocalResponse) Write(p []byte) (int, error) {
	if l.code == 0 {
		l.code = http.StatusOK
	}
	return l.body.Write(p)
}

// WriteLocal sends lr (nothing when it has no status: the client left).
func (c *Conn) WriteLocal(lr *LocalResponse, keep bool) (int64, error) {
	c.bodySent = 0
	if lr.code == 0 {
		return 0, errors.New("no answer")
	}
	buf := wire.Bufs.Get()
	defer wire.Bufs.Put(buf)
	delete(lr.h, "Content-Length")
	b := appendStatusLine(buf[:0], lr.code, "")
	b = wire.AppendHeaders(b, lr.h)
	b = appendDate(b, lr.h)
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(lr.body.Len()), 10)
	b = append(b, "\r\n"...)
	if !keep {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	head := len(b)
	b = append(b, lr.body.Bytes()...)
	n, err := c.tc.Write(b)
	c.bodySent = int64(max(n-head, 0))
	return int64(n), err
}
