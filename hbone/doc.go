// Package hbone implements HBONE, Istio ambient's tunnel protocol: HTTP/2
// CONNECT over mutual TLS 1.3 (ALPN h2) on port 15008. The wire facts
// it follows (headers, identities, HTTP/2 settings) are written up, with
// their upstream sources, in docs/protocol.md, section HBONE.
//
// It holds three pieces that the proxy wires together:
//
//   - Server: accepts HBONE connections for one local workload identity,
//     verifies the client certificate (trust bundle plus same trust domain),
//     parses each CONNECT (:authority ip:port, baggage, forwarded,
//     traceparent) and asks a Handler for a verdict; on 200 it splices the
//     stream with the upstream the handler dialled, passing half-close both
//     ways.
//   - Pool: outbound connections keyed by (source identity, expected
//     destination identities, source IP, next hop), several streams per
//     connection, several connections per key, one handshake in flight per
//     key, idle expiry.
//   - Tunnel: one CONNECT stream, a net.Conn with CloseWrite and byte
//     counters.
//   - Double HBONE (Pool.ConnectThrough, DialOver): a client connection
//     whose TLS and HTTP/2 run inside another tunnel, to reach a workload
//     on another network through its network gateway. The server side
//     needs nothing special: a gateway is a Server with AcceptHostnames
//     whose Handler forwards the stream (Reply.Upstream or Reply.Serve).
//
// The HTTP/2 framing layer is our own small engine (conn*.go) built on
// golang.org/x/net/http2/hpack, not x/net's Server and Transport: the
// Transport keeps a request-body scratch buffer of up to 512 KiB and a
// goroutine per stream for the life of a CONNECT, and the Server cannot
// half-close a response while still reading the request body (it resets the
// stream when the handler returns). Both defeat HBONE's half-close semantics
// or its memory budget (see bench/README.md).
//
// The package decides nothing about routing or authorization: callers pass
// the next hop, the expected identities and the authority, and the server's
// Handler decides 200/401/503. It does not import internal/node/state, the CA or
// Kubernetes packages; certificates come through identity.CertSource.
//
// Errors: every error the package returns starts with "hbone: " once, then
// names the step that failed. What such an error wraps is a bare phrase: the
// sentinels (ErrConnClosed, ErrHandshake, ...), the cause a connection ended
// with, the certificate checks' verdicts. So a message reads
// "hbone: connect 10.0.0.7:15008: tls handshake failed: server certificate
// [...]: peer identity not accepted: want one of [...]". Match errors with
// errors.Is and errors.As, never by their text.
package hbone
