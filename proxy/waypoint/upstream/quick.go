package upstream

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/wire"
)

// quickResponse reads a response head in the plain subset
// (wire.ParseFields) as http.ReadResponse would, once it is all in br's
// buffer, its body to be read from br after it; nil for any other head,
// or one not yet buffered whole, which http.ReadResponse then reads.
// Besides the field lines, the subset is: "HTTP/1.1 SP code SP reason" in
// visible ASCII with a code from 200 to 599 other than 204 and 304, to a
// request other than HEAD; one Content-Length; no Transfer-Encoding,
// Connection, Trailer or Pragma. FuzzResponseHeadDifferential compares it
// with http.ReadResponse.
func quickResponse(br *bufio.Reader, req *http.Request) *http.Response {
	if req.Method == http.MethodHead {
		return nil
	}
	if _, err := br.Peek(1); err != nil {
		return nil // http.ReadResponse reads again and reports it
	}
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return nil
	}
	s := string(buf[:end+4]) // one allocation: every string below shares it
	eol := strings.Index(s, "\r\n")
	proto, status, ok := strings.Cut(s[:eol], " ")
	if !ok || proto != "HTTP/1.1" || !wire.PlainText(status) {
		return nil
	}
	code, _, _ := strings.Cut(status, " ")
	if len(code) != 3 {
		return nil
	}
	c := 0
	for i := range 3 {
		if code[i] < '0' || code[i] > '9' {
			return nil
		}
		c = c*10 + int(code[i]-'0')
	}
	if c < 200 || c > 599 || c == http.StatusNoContent || c == http.StatusNotModified {
		return nil
	}
	h, ok := wire.ParseFields(s[eol+2:], 0)
	if !ok || len(h["Content-Length"]) != 1 {
		return nil
	}
	for _, k := range [...]string{"Transfer-Encoding", "Connection", "Trailer", "Pragma"} {
		if _, ok := h[k]; ok {
			return nil
		}
	}
	n, ok := wire.ContentLength(h)
	if !ok {
		return nil
	}
	_, _ = br.Discard(len(s)) // buffered
	resp := &http.Response{
		Status: status, StatusCode: c,
		Proto: proto, ProtoMajor: 1, ProtoMinor: 1,
		Header: h, ContentLength: n, Body: http.NoBody, Request: req,
	}
	if n > 0 {
		resp.Body = wire.NewBody(br, n, false)
	}
	return resp
}
