package waypoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry"
)

// Protocol detection on a port that declares no protocol (Protocol AUTO),
// as Istio's sniffing (Envoy's http_inspector): the client's first bytes
// decide. An HTTP/1.x request line or the HTTP/2 prior-knowledge preface is
// served as HTTP; anything else, or nothing before DetectTimeout (a
// server-first protocol such as MySQL), is TCP with the bytes read so far
// sent upstream first.

// DefaultDetectTimeout is how long a tunnel to an AUTO port waits for the
// client's first bytes: Istio's protocolDetectionTimeout as it last had a
// non-zero default (5s). Istio's default is now 0s (wait forever), which
// leaves a server-first protocol on an undeclared port hanging; ours falls
// back to TCP instead.
const DefaultDetectTimeout = 5 * time.Second

// maxSniff bounds what detection reads: a request line longer than this is
// not taken as HTTP.
const maxSniff = 8 << 10

type sniffed int

const (
	sniffUndecided sniffed = iota
	sniffTCP
	sniffHTTP1
	sniffH2
)

var h2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

// classify decides what the first bytes b are, or sniffUndecided while a
// longer b could still be HTTP.
func classify(b []byte) sniffed {
	if len(b) == 0 {
		return sniffUndecided
	}
	if n := min(len(b), len(h2Preface)); bytes.Equal(b[:n], h2Preface[:n]) {
		if n == len(h2Preface) {
			return sniffH2
		}
		return sniffUndecided
	}
	// METHOD SP request-target SP HTTP/1.x CRLF (RFC 9112 section 3).
	sp := bytes.IndexByte(b, ' ')
	method := b
	if sp >= 0 {
		method = b[:sp]
	}
	if len(method) > 32 || (sp == 0) {
		return sniffTCP
	}
	for _, c := range method {
		if !isTchar(c) {
			return sniffTCP
		}
	}
	if sp < 0 {
		return sniffUndecided
	}
	rest := b[sp+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	target := rest
	if sp2 >= 0 {
		target = rest[:sp2]
	}
	for _, c := range target {
		if c <= ' ' || c == 0x7f {
			return sniffTCP
		}
	}
	if sp2 < 0 {
		return sniffUndecided
	}
	if sp2 == 0 {
		return sniffTCP
	}
	version := rest[sp2+1:]
	for _, want := range [][]byte{[]byte("HTTP/1.1\r\n"), []byte("HTTP/1.0\r\n"), []byte("HTTP/1.1\n"), []byte("HTTP/1.0\n")} {
		n := min(len(version), len(want))
		if bytes.Equal(version[:n], want[:n]) {
			if n == len(want) {
				return sniffHTTP1
			}
			if n == len(version) {
				return sniffUndecided
			}
		}
	}
	return sniffTCP
}

func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0
}

// sniff reads c's first bytes until classify decides, the client stops
// sending (EOF: TCP with what it sent), maxSniff bytes are read or timeout
// passes (TCP). It returns the bytes read, to be replayed.
func sniff(c net.Conn, timeout time.Duration) ([]byte, sniffed, error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, sniffTCP, err
	}
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 0, 1024)
	for {
		if v := classify(buf); v != sniffUndecided {
			return buf, v, nil
		}
		if len(buf) >= maxSniff {
			return buf, sniffTCP, nil
		}
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, cap(buf))...)[:len(buf)]
		}
		n, err := c.Read(buf[len(buf):min(cap(buf), maxSniff)])
		buf = buf[:len(buf)+n]
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, io.EOF):
			if v := classify(buf); v != sniffUndecided {
				return buf, v, nil
			}
			return buf, sniffTCP, nil
		default:
			return buf, sniffTCP, err
		}
	}
}

// serveAuto serves a tunnel to an AUTO port: HTTP as serveTunnel does, or
// TCP as serveTCP does once the bytes decided. The tunnel is already
// accepted (200): a TCP stream that the filters refuse, or whose endpoint
// does not answer, is closed, as Envoy closes a sniffed connection.
func (w *Waypoint) serveAuto(t *hbone.Tunnel, ex *exchange, meta *tunnelMeta, start time.Time) error {
	pre, kind, err := sniff(t, w.opts.DetectTimeout)
	if err != nil {
		return fmt.Errorf("waypoint: detecting the protocol: %w", err)
	}
	switch kind {
	case sniffHTTP1:
		m := *meta
		m.protocol = waypointapi.Protocol_HTTP
		return w.serveTunnelPre(t, &m, pre)
	case sniffH2:
		m := *meta
		m.protocol = waypointapi.Protocol_HTTP2
		return w.serveTunnelPre(t, &m, pre)
	}
	ex.protocol = waypointapi.Protocol_TCP
	if err := w.decideTCP(ex); err != nil {
		code := http.StatusServiceUnavailable
		var nr *stream.Refusal
		if errors.As(err, &nr) {
			code = nr.Code
		}
		ex.err = err
		w.record(ex, code, flagFor(code, err), time.Since(start), telemetry.Sizes{})
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	up, err := w.dial(ctx, ex.target, hbone.BuildForwarded(ex.src, ex.attrs.Service))
	cancel()
	if err != nil {
		ex.err = err
		w.record(ex, http.StatusServiceUnavailable, "UF", time.Since(start), telemetry.Sizes{})
		return err
	}
	st := w.record(ex, http.StatusOK, "", time.Since(start), telemetry.Sizes{})
	if len(pre) > 0 {
		if _, err := up.Write(pre); err != nil {
			up.Close()
			st.Done(int64(len(pre)), 0)
			return err
		}
	}
	err = hbone.Splice(t, up)
	ts := t.Stats()
	st.Done(ts.BytesReceived, ts.BytesSent)
	return err
}

// dialTimeout bounds a TCP connection's upstream dial after detection
// (Istio's connectTimeout default, 10s).
const dialTimeout = 10 * time.Second
