package h1

import (
	"bufio"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/wire"
)

// quickRequest reads a request head in the plain subset (wire.ParseFields)
// as http.ReadRequest would, its body to be read from br after the head;
// nil for any other head, which http.ReadRequest then reads. Besides the
// field lines, the subset is: "method SP target SP HTTP/1.1" with a token
// method and an origin-form target of visible ASCII that url.ParseRequestURI
// reads; one Host field; no Transfer-Encoding (chunked bodies keep
// net/http's reader), Trailer or Pragma (which net/http rewrites).
// FuzzH1HeadDifferential compares it with http.ReadRequest through
// readRequest.
func quickRequest(head []byte, br *bufio.Reader) *http.Request {
	s := string(head) // one allocation: every string below shares it
	eol := strings.Index(s, "\r\n")
	if eol < 0 {
		return nil
	}
	method, rest, ok1 := strings.Cut(s[:eol], " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	// A method is a token, as a field name is (net/http's validMethod).
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !httpguts.ValidHeaderFieldName(method) ||
		!strings.HasPrefix(target, "/") || !wire.PlainText(target) {
		return nil
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil
	}
	// Room for what the waypoint adds before the request goes upstream: a
	// request id, four forwarding fields, trace context, a route's fields.
	h, ok := wire.ParseFields(s[eol+2:], 8)
	if !ok || len(h["Host"]) != 1 {
		return nil
	}
	for _, k := range [...]string{"Transfer-Encoding", "Trailer", "Pragma"} {
		if _, ok := h[k]; ok {
			return nil
		}
	}
	n, ok := wire.ContentLength(h)
	if !ok {
		return nil
	}
	r := &http.Request{
		Method: method, URL: u, RequestURI: target,
		Proto: proto, ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Host: h["Host"][0], // http.ReadRequest leaves Host out of Header
		Close: httpguts.HeaderValuesContainsToken(h["Connection"], "close"),
		Body:  http.NoBody,
	}
	delete(h, "Host")
	if n > 0 {
		r.ContentLength = n
		r.Body = wire.NewBody(br, n, r.Close)
	}
	return r
}
