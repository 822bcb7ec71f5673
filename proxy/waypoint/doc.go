// Package waypoint is ztunnel-go's L7 waypoint data path: it terminates HBONE
// on 15008 with the waypoint's own SPIFFE identity, accepts a CONNECT only
// for a service VIP or workload bound to this waypoint (never an open
// relay), and then, inside the tunnel, speaks HTTP/1.1 or h2c (prior
// knowledge) when the service port's protocol is HTTP, else plain TCP with
// L4 policy only.
//
// Every request, HTTP or TCP, runs one code path (Waypoint.decide) with one
// filter order: metadata (peer identity, baggage) → authentication →
// authorization → routing → stats. Authorization and routing read an
// immutable compiled Config (config.go) swapped atomically when the control
// plane pushes a new waypointapi.Config; endpoints come from the workload
// API snapshot (internal/node/state) on the same xDS stream. The chosen
// endpoint is reached over HBONE through its node proxy with the waypoint's
// identity (hbone.Pool), the original source in the forwarded headers. A
// backend with a DestinationRule subset or traffic policy is balanced here
// instead (lb.go: subset members, loadBalancer.simple; outlier.go:
// consecutive-error ejection, per-endpoint atomic counters that outlive
// config pushes); VirtualService fault injection runs before the request
// goes upstream (fault.go).
//
// HTTP/1.1 is forwarded by a path of the waypoint's own (h1.go: one
// request at a time on the tunnel's goroutine, keep-alive upstream
// connections per endpoint); HTTP/2, h2c, upgrades, Expect: 100-continue and
// the rest of what it leaves go through net/http's server and ReverseProxy
// (http.go).
//
// Authentication (jwt.go) validates the JWTs of the RequestAuthentications
// that apply (keys parsed once per config): a request without a token is
// anonymous, one with an invalid token is answered 401; a valid token gives
// the request principal and claims authorization matches (authz.go).
package waypoint
