package waypoint

import (
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/authn"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/authz"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/pathnorm"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// What zctl explain needs to run this waypoint's own decisions on a
// dumped Config (the waypoint's /config_dump compiled with Compile): the
// binding check ServeHBONE makes and the authorization every request runs.

// Binding is what the waypoint accepts a CONNECT to an address as.
type Binding struct {
	// Service is "namespace/name" and Hostname the hostname of the bound
	// service; both empty when a bound workload was addressed.
	Service, Hostname string
	// Protocol is the service port's protocol (TCP for a workload): HTTP
	// and HTTP2 are served as HTTP, TCP gets L4 policy only, AUTO is HTTP
	// when the client's first bytes are (sniff.go), else TCP.
	Protocol waypointapi.Protocol
}

// Bind reports how the waypoint treats a CONNECT to dst, as ServeHBONE
// does: a bound service's port, a bound workload, or an error saying why it
// is refused (not bound: the waypoint is never an open relay).
func (c *Config) Bind(dst netip.AddrPort) (Binding, error) {
	ip := dst.Addr().Unmap()
	if svc := c.services[ip]; svc != nil {
		p, ok := svc.ports[dst.Port()]
		if !ok {
			return Binding{}, fmt.Errorf("port %d is not a port of service %s", dst.Port(), svc.hostname)
		}
		return Binding{Service: svc.namespace + "/" + svc.name, Hostname: svc.hostname, Protocol: p}, nil
	}
	if c.workloads[ip] != nil {
		return Binding{Protocol: waypointapi.Protocol_TCP}, nil
	}
	return Binding{}, fmt.Errorf("%s is not bound to this waypoint", dst)
}

// Authenticate runs the waypoint's JWT step (RequestAuthentication) on r for
// service (its hostname, "" for a workload): the very function the data path
// runs before authorization. No token: (nil, nil), anonymous; a valid one:
// its request principal and claims; any other token: an error whose text is
// the 401 body the waypoint answers. r's headers are edited as the data path
// edits them (token removed unless forwarded, claims copied out).
func (c *Config) Authenticate(service string, r *http.Request, now time.Time) (*stream.RequestAuth, error) {
	return authn.Authenticate(c.authn, service, r, now)
}

// Authorize runs the waypoint's authorization on a: the very function the
// data path runs for each request and TCP tunnel.
func (c *Config) Authorize(a *stream.Attrs) stream.Verdict { return authz.Authorize(c.policies, a) }

// NormalizePath normalizes a request target as the data path does before
// authentication, authorization and routing (the mesh's pathNormalization):
// the target forwarded and the path policies match, or why the request is
// refused (400).
func (c *Config) NormalizePath(target string) (forward, path string, err error) {
	return pathnorm.Target(c.pathNorm, target)
}

// PoliciesFor lists, in evaluation order, the policies that select
// requests for hostname ("" for a workload) at this waypoint.
func (c *Config) PoliciesFor(hostname string) []authz.PolicyInfo {
	return authz.PoliciesFor(c.policies, hostname)
}
