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
	u := originForm(target)
	if u == nil {
		var err error
		if u, err = url.ParseRequestURI(target); err != nil {
			return nil
		}
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

// originForm is the URL url.ParseRequestURI reads from an origin-form
// target whose path has no escapes and no byte net/url would escape: Path
// is the path as sent, RawQuery what follows the first '?'. It returns nil
// for any other target (an empty query, which sets ForceQuery, included),
// which url.ParseRequestURI then reads. Its parse was a third of reading a
// plain head (bench/waypoint's CPU profile, 12-07). TestOriginForm checks
// every byte against net/url; FuzzH1HeadDifferential compares whole URLs.
func originForm(target string) *url.URL {
	path, query, hasQuery := strings.Cut(target, "?")
	if hasQuery && query == "" || !strings.HasPrefix(path, "/") {
		return nil
	}
	for i := 0; i < len(path); i++ {
		if !pathByte[path[i]] {
			return nil
		}
	}
	return &url.URL{Path: path, RawQuery: query}
}

// pathByte marks the bytes net/url leaves as they are in a path: RFC
// 3986's unreserved characters, '/', and the sub-delimiters it does not
// escape there.
var pathByte = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("-._~/$&+,:;=@", byte(c)) >= 0
	}
	return t
}()
