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
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry/tracing"
)

// boundService is one service bound to the waypoint, compiled.
type boundService struct {
	name, namespace, hostname, kind string
	ports                           map[uint16]waypointapi.Protocol
	routes                          *routing.Table // nil: no HTTPRoute, go to the service itself
	// ownTelemetry: a Telemetry attaches to this service (targetRefs) and
	// its tracing (nil: none) replaces the waypoint's.
	ownTelemetry bool
	tracing      *tracing.Policy
	// telemetry replaces Config.telemetry for this service's requests
	// (a Telemetry with a Service targetRef); nil: the waypoint's.
	telemetry *telemetry.Config
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
	// tracing is the waypoint's tracing policy (nil: off); anyTracing
	// says whether it or a service's is set, so a waypoint without
	// tracing looks up nothing per request.
	tracing    *tracing.Policy
	anyTracing bool
	// telemetry is the Telemetry API configuration (nil: the default);
	// compiled by the sink, which owns the access log files.
	telemetry *telemetry.Config
	// statsGen is the metrics generation activated with telemetry
	// (telemetry.Recorder.Activate; 0: not tracked, with no recorder and
	// in the config from before the first push).
	statsGen uint64
}

// telemetryFor returns the Telemetry configuration of a request for svc
// (nil: a workload was addressed).
func (c *Config) telemetryFor(svc *boundService) *telemetry.Config {
	if svc != nil && svc.telemetry != nil {
		return svc.telemetry
	}
	return c.telemetry
}

// compileTelemetry compiles the Telemetry parts of c into cc with rec.
func compileTelemetry(cc *Config, c *waypointapi.Config, rec *telemetry.Recorder) {
	cc.telemetry = rec.Compile(c.GetTelemetry())
	for _, s := range c.GetServices() {
		if s.GetTelemetry() == nil {
			continue
		}
		tc := rec.Compile(s.GetTelemetry())
		for _, b := range s.GetAddresses() {
			if a, ok := netip.AddrFromSlice(b); ok {
				if bs := cc.services[a.Unmap()]; bs != nil && bs.hostname == s.GetHostname() {
					bs.telemetry = tc
				}
			}
		}
	}
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

// compileTracing compiles the tracing of c's Telemetry and of its
// services' own (tr starts the providers' exporters).
// A config without Telemetry traces as def says (nil: not at all).
func (c *Config) compileTracing(tr *tracing.Tracer, def *tracing.Config) error {
	cfg := tracing.FromProto(c.raw.GetTelemetry().GetTracing())
	if c.raw.GetTelemetry() == nil && def != nil {
		cfg = *def
	}
	var err error
	if c.tracing, err = tr.Compile(cfg); err != nil {
		return err
	}
	c.anyTracing = c.tracing != nil
	done := map[*boundService]bool{}
	for _, s := range c.raw.GetServices() {
		if s.GetTelemetry() == nil {
			continue
		}
		pol, err := tr.Compile(tracing.FromProto(s.GetTelemetry().GetTracing()))
		if err != nil {
			return fmt.Errorf("service %s: %w", s.GetHostname(), err)
		}
		for _, bs := range c.services {
			if bs.hostname == s.GetHostname() && bs.namespace == s.GetNamespace() && !done[bs] {
				bs.ownTelemetry, bs.tracing, done[bs] = true, pol, true
			}
		}
		c.anyTracing = c.anyTracing || pol != nil
	}
	return nil
}

// tracingPolicies are every tracing policy c uses (for Tracer.Retain).
func (c *Config) tracingPolicies() []*tracing.Policy {
	ps := []*tracing.Policy{c.tracing}
	for _, s := range c.services {
		ps = append(ps, s.tracing)
	}
	return ps
}

// tracingFor is the tracing policy of a request to dst (nil: off): its
// service's own, else the waypoint's. No lookup when nothing traces.
func (c *Config) tracingFor(dst netip.Addr) *tracing.Policy {
	if !c.anyTracing {
		return nil
	}
	if s := c.services[dst]; s != nil && s.ownTelemetry {
		return s.tracing
	}
	return c.tracing
}

// Raw returns the config as received.
func (c *Config) Raw() *waypointapi.Config { return c.raw }

// sink is the xDS sink of a waypoint: the workload API goes to the state
// store, this waypoint's config is compiled and swapped in.
type sink struct {
	*state.Store
	name   string
	cfg    atomic.Pointer[Config]
	tracer *tracing.Tracer // compiles each config's tracing
	// defaultTracing is the tracing of a config without Telemetry.
	defaultTracing *tracing.Config
	// stats compiles the Telemetry API parts (nil: ignored).
	stats *telemetry.Recorder
}

// applyDefaultTracing compiles the current config's tracing again with
// the default (at start: the empty config's).
func (s *sink) applyDefaultTracing() error {
	cur := *s.cfg.Load()
	if err := cur.compileTracing(s.tracer, s.defaultTracing); err != nil {
		return err
	}
	s.cfg.Store(&cur)
	s.tracer.Retain(cur.tracingPolicies()...)
	return nil
}

var _ xds.WaypointSink = (*sink)(nil)

func newSink(name string, tr *tracing.Tracer) *sink {
	s := &sink{Store: state.NewStore(), name: name, tracer: tr}
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
		if err == nil {
			err = cc.compileTracing(s.tracer, s.defaultTracing)
		}
		if err != nil {
			bad[name] = err
			s.tracer.Retain(s.cfg.Load().tracingPolicies()...) // what this config started, stopped
			continue
		}
		if s.stats != nil {
			compileTelemetry(cc, c, s.stats)
			cc.statsGen = s.stats.Activate(cc.telemetry)
		}
		s.cfg.Store(cc)
		s.tracer.Retain(cc.tracingPolicies()...)
	}
	for _, name := range removes {
		if name == s.name {
			empty, _ := Compile(nil)
			_ = empty.compileTracing(s.tracer, s.defaultTracing) // checked at start
			if s.stats != nil {
				empty.statsGen = s.stats.Activate(nil)
			}
			s.cfg.Store(empty)
			s.tracer.Retain(empty.tracingPolicies()...)
		}
	}
	if len(bad) > 0 {
		return bad
	}
	return nil
}
