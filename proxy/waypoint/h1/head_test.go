package h1

import "testing"

// TestScanHead: where a head ends (CRLF or bare LF lines, as net/textproto
// reads them) and what the raw scan decides before http.ReadRequest.
func TestScanHead(t *testing.T) {
	for _, tc := range []struct {
		head     string
		end      int // 0: incomplete
		fallback bool
		bad      string
	}{
		{head: "GET / HTTP/1.1\r\nHost: a\r\n\r\nrest", end: 27},
		{head: "GET / HTTP/1.1\nHost: a\n\nrest", end: 24},
		{head: "GET / HTTP/1.1\r\nHost: a\r\n", end: 0},
		{head: "GET / HTTP/1.0\r\n\r\n", end: -1, fallback: true},
		{head: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", end: 18, fallback: true},
		{head: "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", end: -1, fallback: true},
		{head: "GET / HTTP/1.1\r\nHost: a\r\nUPGRADE: websocket\r\n\r\n", end: -1, fallback: true},
		{head: "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n", end: -1, fallback: true},
		{head: "POST / HTTP/1.1\r\nHost: a\r\nTrailer: X\r\nTransfer-Encoding: chunked\r\n\r\n", end: -1, fallback: true},
		{head: "POST / HTTP/1.1\r\nHost: a\r\ncontent-length: 3\r\nTRANSFER-ENCODING: chunked\r\n\r\n", end: -1, bad: "both Content-Length and Transfer-Encoding"},
		{head: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", end: -1},
		{head: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 03\r\n\r\n", end: -1, bad: "differing Content-Length headers"},
		{head: "GET / HTTP/1.1\r\nHost: a\r\n\tfolded\r\n\r\n", end: -1, bad: "obsolete line folding"},
	} {
		if tc.end < 0 {
			tc.end = len(tc.head)
		}
		end := headEnd([]byte(tc.head))
		if end != tc.end {
			t.Errorf("headEnd(%q) = %d, want %d", tc.head, end, tc.end)
			continue
		}
		if end == 0 {
			continue
		}
		info := scanHead([]byte(tc.head[:end]))
		if info.fallback != tc.fallback || info.bad != tc.bad {
			t.Errorf("scanHead(%q) = %+v, want fallback %v bad %q", tc.head, info, tc.fallback, tc.bad)
		}
	}
}
