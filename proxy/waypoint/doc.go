// Package waypoint is ztunnel-go's L7 waypoint data path: it terminates HBONE
// on 15008 with the waypoint's own SPIFFE identity, accepts a CONNECT only
// for a service VIP or workload bound to this waypoint (never an open
// relay), and then, inside the tunnel, speaks HTTP/1.1 or h2c (prior
// knowledge) when the service port's protocol is HTTP, else plain TCP with
// L4 policy only; on a port of no declared protocol (AUTO) the client's
// first bytes decide, as Istio's protocol sniffing (sniff.go).
//
// Every request, HTTP or TCP, runs one code path (Waypoint.decide) with one
// filter order: metadata (peer identity, baggage) → authentication →
// authorization → routing → stats. Each filter is a package of its own, as
// Envoy's filters are, and none imports another; this package assembles the
// chain and keeps the listeners:
//
//   - authn: RequestAuthentication (JWT) validation; a request without a
//     token is anonymous, one with an invalid token is answered 401; a
//     valid token gives the request principal and claims;
//   - authz: AuthorizationPolicy (DENY before ALLOW);
//   - routing: HTTPRoute, GRPCRoute and VirtualService rules, DestinationRule
//     subsets, load balancing and outlier detection (per-endpoint atomic
//     counters that outlive config pushes), fault injection, mirroring;
//   - telemetry: istio_* metrics and the access log;
//   - h1 and upstream: the HTTP/1.1 fast path (below), downstream and
//     upstream.
//
// What the filters tell each other about a request travels in the shared
// package stream (its attributes, what authentication proved, what
// authorization decided, a refusal); the HTTP/1.1 text the fast path writes
// is the shared package wire. Authorization and routing read an immutable
// compiled Config (config.go) swapped atomically when the control plane
// pushes a new waypointapi.Config; endpoints come from the workload API
// snapshot (internal/node/state) on the same xDS stream. The chosen
// endpoint is reached over HBONE through its node proxy with the waypoint's
// identity (hbone.Pool), the original source in the forwarded headers.
//
// HTTP/1.1 is forwarded by a path of the waypoint's own (fastpath.go with
// packages h1 and upstream: one request at a time on the tunnel's
// goroutine, keep-alive upstream connections per endpoint); HTTP/2, h2c,
// upgrades, Expect: 100-continue and the rest of what it leaves go through
// net/http's server and ReverseProxy (http.go).
package waypoint
