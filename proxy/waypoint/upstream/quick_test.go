package upstream

import (
	"bufio"
	"bytes"
	"io"
	"maps"
	"net/http"
	"slices"
	"testing"
)

// FuzzResponseHeadDifferential feeds quickResponse and http.ReadResponse
// the same bytes: where quickResponse reads a response, net/http must read
// the same one (status, header, framing, body, and how the body ends), and
// leave the same bytes after it for the next response.
func FuzzResponseHeadDifferential(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",
		"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\n",
		"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nX-A: 1\r\nx-a:  2 \r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n",
		"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1  200 OK\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 200 OK\nContent-Length: 1\n\nx",
		"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx",
		"HTTP/1.1 200 OK\r\nX Y: 1\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 1\r\n\r\nx",
	} {
		f.Add([]byte(s), byte(0))
	}
	f.Fuzz(func(t *testing.T, in []byte, m byte) {
		req := &http.Request{Method: [...]string{http.MethodGet, http.MethodPost, http.MethodHead}[int(m)%3]}
		br := bufio.NewReaderSize(bytes.NewReader(in), 4<<10)
		r := quickResponse(br, req)
		if r == nil {
			return
		}
		rbr := bufio.NewReader(bytes.NewReader(in))
		ref, err := http.ReadResponse(rbr, req)
		if err != nil {
			t.Fatalf("%q: quickResponse reads it, net/http refuses it: %v", in, err)
		}
		if r.Status != ref.Status || r.StatusCode != ref.StatusCode || r.Proto != ref.Proto || r.ProtoMajor != ref.ProtoMajor ||
			r.ProtoMinor != ref.ProtoMinor || r.ContentLength != ref.ContentLength || r.Close != ref.Close ||
			!slices.Equal(r.TransferEncoding, ref.TransferEncoding) || len(ref.Trailer) > 0 || r.Request != ref.Request ||
			!maps.EqualFunc(r.Header, ref.Header, slices.Equal) {
			t.Fatalf("%q: quickResponse read %q %v cl %d close %v, net/http %q %v cl %d close %v te %v trailer %v", in,
				r.Status, r.Header, r.ContentLength, r.Close, ref.Status, ref.Header, ref.ContentLength, ref.Close, ref.TransferEncoding, ref.Trailer)
		}
		if (r.Body == http.NoBody) != (ref.Body == http.NoBody) {
			t.Fatalf("%q: quickResponse's body is NoBody %v, net/http's %v", in, r.Body == http.NoBody, ref.Body == http.NoBody)
		}
		b, err := io.ReadAll(r.Body)
		rb, rerr := io.ReadAll(ref.Body)
		if !bytes.Equal(b, rb) || err != rerr {
			t.Fatalf("%q: bodies differ: %q (%v), net/http %q (%v)", in, b, err, rb, rerr)
		}
		rest, _ := io.ReadAll(br)
		refRest, _ := io.ReadAll(rbr)
		if !bytes.Equal(rest, refRest) {
			t.Fatalf("%q: after the response %q is left, after net/http's %q", in, rest, refRest)
		}
	})
}
