package hbone

import (
	"errors"
	"fmt"
	"net/http"

	"golang.org/x/net/http2"
)

// StatusError is returned by Connect when the server answers the CONNECT
// with anything but 200. Code is the HTTP status (400, 401, 503, ...).
type StatusError struct {
	Code int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("hbone: server answered %d %s", e.Code, http.StatusText(e.Code))
}

// StreamResetError reports that a tunnel's stream was reset (RST_STREAM) by
// the peer, or by this side after an error.
type StreamResetError struct {
	Code   http2.ErrCode
	Remote bool // true when the peer sent the reset
}

func (e *StreamResetError) Error() string {
	who := "locally"
	if e.Remote {
		who = "by peer"
	}
	return fmt.Sprintf("hbone: stream reset %s (%s)", who, e.Code)
}

var (
	// ErrConnectTimeout is wrapped when the TCP connect or TLS handshake to
	// the next hop does not finish within the connect timeout.
	ErrConnectTimeout = errors.New("timed out; is a NetworkPolicy blocking port 15008?")

	// ErrHandshake is wrapped by every TLS handshake failure (bad chain,
	// expired certificate, wrong identity, no ALPN h2).
	ErrHandshake = errors.New("tls handshake failed")

	// ErrIdentityMismatch is wrapped (with ErrHandshake) when the peer's
	// certificate chains to the bundle but names no acceptable identity:
	// on the client, the server's URI SAN is not in the expected list; on
	// the server, the client is from another trust domain.
	ErrIdentityMismatch = errors.New("peer identity not accepted")

	// ErrConnClosed is wrapped by the errors of streams on a connection
	// that has gone away (closed, GOAWAY, keepalive timeout). The error
	// that closed the connection is wrapped alongside it when known.
	ErrConnClosed = errors.New("connection closed")

	// ErrPoolClosed is wrapped by the error of Connect after Pool.Close.
	ErrPoolClosed = errors.New("pool closed")

	// ErrServerClosed is wrapped by the error of Serve after Shutdown or
	// Close.
	ErrServerClosed = errors.New("server closed")

	// errRetry marks failures that happened before the server processed the
	// stream (REFUSED_STREAM, GOAWAY above our stream id, a connection that
	// became unusable between reservation and use): the pool retries them.
	errRetry = errors.New("stream not processed; retry on another connection")
)
