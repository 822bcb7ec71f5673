package waypoint

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/authn"
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
	// and HTTP2 are served as HTTP, TCP gets L4 policy only.
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
func (c *Config) Authorize(a *Attrs) Verdict { return authorize(c.policies, a) }

// PolicyInfo is one policy that selects requests for a service here.
type PolicyInfo struct {
	Key    string // ns/name
	Action waypointapi.Action
	DryRun bool
	// HTTP is true when a rule reads request fields (host, method, path,
	// request headers, the JWT's request principal and claims): its match
	// then depends on the request, not only on the connection.
	HTTP bool
}

// PoliciesFor lists, in evaluation order, the policies that select
// requests for hostname ("" for a workload) at this waypoint.
func (c *Config) PoliciesFor(hostname string) []PolicyInfo {
	var out []PolicyInfo
	for _, p := range c.policies {
		if !p.applies(hostname) {
			continue
		}
		info := PolicyInfo{Key: p.key, Action: p.action, DryRun: p.dryRun}
		for _, r := range p.rules {
			for i := range r.from {
				info.HTTP = info.HTTP || len(r.from[i].requestPrincipals)+len(r.from[i].notRequestPrincipals) > 0
			}
			for i := range r.to {
				info.HTTP = info.HTTP || r.to[i].usesHTTP()
			}
			for _, w := range r.when {
				info.HTTP = info.HTTP || strings.HasPrefix(w.key, "request.")
			}
		}
		out = append(out, info)
	}
	return out
}
