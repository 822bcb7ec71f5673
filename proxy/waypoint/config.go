package waypoint

import (
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/authn"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/authz"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/pathnorm"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/routing"
)

// boundService is one service bound to the waypoint, compiled.
type boundService struct {
	name, namespace, hostname, kind string
	ports                           map[uint16]waypointapi.Protocol
	routes                          *routing.Table // nil: no HTTPRoute, go to the service itself
	// originatesTLS: a DestinationRule tls (SIMPLE, MUTUAL) applies to a
	// backend of its routes. The TCP path does not originate TLS: it
	// refuses such a stream rather than send it in plaintext.
	originatesTLS bool
}

// Config is the compiled, immutable form of one waypointapi.Config. The data
// path reads it through one atomic load per connection.
type Config struct {
	raw       *waypointapi.Config
	services  map[netip.Addr]*boundService // by VIP
	workloads map[netip.Addr]*waypointapi.Workload
	policies  []*authz.Policy
	authn     []*authn.Policy // RequestAuthentications, keys parsed
	// pathNorm is the mesh's pathNormalization; an unknown value from a
	// newer control plane is the strongest option (fail closed).
	pathNorm pathnorm.Mode
}

// Compile checks and compiles c. A nil c compiles to the empty config
// (nothing bound: every CONNECT is refused).
func Compile(c *waypointapi.Config) (*Config, error) {
	out := &Config{raw: c, services: map[netip.Addr]*boundService{}, workloads: map[netip.Addr]*waypointapi.Workload{}}
	for _, s := range c.GetServices() {
		bs := &boundService{name: s.GetName(), namespace: s.GetNamespace(), hostname: s.GetHostname(), kind: s.GetKind(),
			ports: map[uint16]waypointapi.Protocol{}, routes: routing.Compile(s.GetRoutes())}
		for _, r := range s.GetRoutes() {
			for _, rr := range r.GetRules() {
				for _, b := range rr.GetBackends() {
					bs.originatesTLS = bs.originatesTLS || b.GetTrafficPolicy().GetTls() != nil
				}
			}
		}
		for _, p := range s.GetPorts() {
			if p.GetPort() == 0 || p.GetPort() > 65535 {
				return nil, fmt.Errorf("service %s: port %d out of range", s.GetHostname(), p.GetPort())
			}
			bs.ports[uint16(p.GetPort())] = p.GetProtocol()
		}
		for _, b := range s.GetAddresses() {
			a, ok := netip.AddrFromSlice(b)
			if !ok {
				return nil, fmt.Errorf("service %s: address of %d bytes", s.GetHostname(), len(b))
			}
			out.services[a.Unmap()] = bs
		}
	}
	for _, w := range c.GetWorkloads() {
		for _, b := range w.GetAddresses() {
			a, ok := netip.AddrFromSlice(b)
			if !ok {
				return nil, fmt.Errorf("workload %s: address of %d bytes", w.GetUid(), len(b))
			}
			out.workloads[a.Unmap()] = w
		}
	}
	for _, p := range c.GetPolicies() {
		out.policies = append(out.policies, authz.Compile(p))
	}
	out.authn = authn.Compile(c.GetAuthentications())
	out.pathNorm = pathnorm.Mode(c.GetPathNormalization())
	if out.pathNorm.String() == "UNKNOWN" {
		out.pathNorm = pathnorm.DecodeAndMergeSlashes
	}
	return out, nil
}

// Raw returns the config as received.
func (c *Config) Raw() *waypointapi.Config { return c.raw }

// sink is the xDS sink of a waypoint: the workload API goes to the state
// store, this waypoint's config is compiled and swapped in.
type sink struct {
	*state.Store
	name string
	cfg  atomic.Pointer[Config]
}

var _ xds.WaypointSink = (*sink)(nil)

func newSink(name string) *sink {
	s := &sink{Store: state.NewStore(), name: name}
	empty, _ := Compile(nil)
	s.cfg.Store(empty)
	return s
}

func (s *sink) ApplyAddresses(u map[string]*workloadapi.Address, r []string) error {
	return s.Store.ApplyAddresses(u, r)
}

func (s *sink) ApplyAuthorizations(u map[string]*securityapi.Authorization, r []string) error {
	return s.Store.ApplyAuthorizations(u, r)
}

// ApplyWaypoints takes this waypoint's config; a removal empties it (the
// waypoint then accepts nothing: fail closed). Other names are rejected.
func (s *sink) ApplyWaypoints(upserts map[string]*waypointapi.Config, removes []string) error {
	bad := xds.ResourceErrors{}
	for name, c := range upserts {
		if name != s.name {
			bad[name] = fmt.Errorf("not this waypoint's config (%s)", s.name)
			continue
		}
		cc, err := Compile(c)
		if err != nil {
			bad[name] = err
			continue
		}
		s.cfg.Store(cc)
	}
	for _, name := range removes {
		if name == s.name {
			empty, _ := Compile(nil)
			s.cfg.Store(empty)
		}
	}
	if len(bad) > 0 {
		return bad
	}
	return nil
}
